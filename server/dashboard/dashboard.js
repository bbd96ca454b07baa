// The coordinator's dashboard: jobs, a job's rounds (latency by phase, accuracy and loss,
// percentiles after warm-up, the communication share), one round's workers on a timeline,
// and the workers. Reads the coordinator's read-only JSON (/api/...) and follows the chosen
// job's server-sent events. Every string from the coordinator is set as text, never as HTML.
"use strict";

// A round's time, phase by phase along its critical path (the accepted report that arrived
// last): these add up to the round's total (docs/MONITORING.md).
const PHASES = [
  ["selection_ms", "selection", "#8e8cd8"],
  ["critical_download_ms", "download", "#5b8def"],
  ["critical_data_load_ms", "data loading", "#9aa0a6"],
  ["critical_compute_ms", "compute", "#34a853"],
  ["critical_upload_ms", "upload", "#f29900"],
  ["after_last_report_ms", "waiting for stragglers", "#d93025"],
  ["aggregation_ms", "aggregation", "#a142f4"],
  ["evaluation_ms", "evaluation", "#12a4af"],
  ["commit_ms", "commit", "#80868b"],
  ["other_ms", "other", "#c6c6c6"],
];
const COMMUNICATION_WARNING = 0.4;  // of a round, as the seeds' guidance has it

let selectedJob = null;
let selectedRound = null;
let followLatest = true;  // the timeline shows the newest round until another one is picked
let jobRequests = 0;      // loadJob's replies can come back out of order: only the newest is shown
let jobView = null;
// The selected job's rounds fetched so far: each load asks only for the newest of them again
// and those after it, page by page (/api/job bounds its reply and says where the next page
// starts).
let roundCache = { id: null, rounds: [] };
let charts = {};
let streamAbort = null;

function token() { return sessionStorage.getItem("tessera-admin-token") || ""; }

function setStatus(text) { document.getElementById("status").textContent = text; }

async function api(path, init = {}) {
  const headers = {};
  if (token()) headers["Authorization"] = "Bearer " + token();
  const response = await fetch(path, { ...init, headers, cache: "no-store" });
  if (response.status === 401 || response.status === 403) {
    document.getElementById("login").hidden = false;
    setStatus((await response.text()).trim());
    throw new Error("not signed in");
  }
  if (!response.ok) throw new Error(path + ": " + response.status + " " + (await response.text()).trim());
  return response;
}

function stateName(state) { return String(state || "").replace(/^JOB_/, "").toLowerCase(); }

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function fmt(ms) { return ms >= 10000 ? (ms / 1000).toFixed(1) + " s" : ms.toFixed(1) + " ms"; }
// Bytes as the JSON gives them (a uint64 is a string) in KiB.
function kib(bytes) { return (Number(bytes || 0) / 1024).toFixed(1) + " KiB"; }

function ago(unixMs) {
  if (!unixMs) return "-";
  const s = Math.max(0, (Date.now() - Number(unixMs)) / 1000);
  return s < 120 ? Math.round(s) + " s ago" : s < 7200 ? Math.round(s / 60) + " min ago" : Math.round(s / 3600) + " h ago";
}

async function loadJobs() {
  const jobs = (await (await api("/api/jobs")).json()).jobs || [];
  const body = document.querySelector("#jobs tbody");
  body.replaceChildren();
  for (const job of jobs) {
    const row = el("tr", null, "selectable" + (job.id === selectedJob ? " selected" : ""));
    row.dataset.job = job.id;
    row.append(el("td", job.id), el("td", job.spec ? job.spec.name : ""),
               el("td", stateName(job.state), "state-" + stateName(job.state)),
               el("td", job.rounds_committed + "/" + (job.spec ? job.spec.rounds : "?")),
               el("td", job.rounds_committed ? (100 * job.last_round.test_accuracy).toFixed(2) + "%" : "-"));
    row.addEventListener("click", () => selectJob(job.id));
    body.append(row);
  }
  if (!selectedJob && jobs.length) {
    const running = jobs.find((j) => stateName(j.state) === "running");
    selectJob((running || jobs[jobs.length - 1]).id);
  }
}

// The worker's compute in the newest round of the chosen job that it took part in.
function recentCompute(workerId) {
  const rounds = (jobView && jobView.rounds) || [];
  for (let i = rounds.length - 1; i >= 0; --i) {
    const w = (rounds[i].workers || []).find((x) => x.worker_id === workerId);
    if (w && w.compute_ms > 0) return fmt(w.compute_ms) + " (round " + rounds[i].round + ")";
  }
  return "-";
}

// A worker's device as the table shows it: the "(emulated)" label says what the registry's
// `emulated` field says, whatever the name holds or where it was cut. An emulated device's
// name ends with the label once; a device that is not emulated never shows it.
function deviceName(device) {
  if (!device) return "";
  const label = " (emulated)";
  let name = device.name || "";
  while (name.endsWith(label)) name = name.slice(0, -label.length);
  return device.emulated ? name + label : name;
}

async function loadWorkers() {
  const reply = await (await api("/api/workers")).json();
  const workers = reply.workers || [];
  const body = document.querySelector("#workers tbody");
  body.replaceChildren();
  for (const w of workers) {
    const row = el("tr");
    row.append(el("td", w.worker_id), el("td", w.alive ? w.state : "gone (" + w.state + ")"),
               el("td", ago(w.last_heartbeat_unix_ms)),
               el("td", deviceName(w.device)), el("td", w.cohort || ""),
               el("td", w.rounds_completed), el("td", w.updates_rejected), el("td", recentCompute(w.worker_id)),
               el("td", w.device ? Number(w.device.measured_gflops).toFixed(1) : ""));
    body.append(row);
  }
  // The reply holds at most 1,000 workers (as `tessera workers`); it counts the others.
  const more = Number(reply.more || 0);
  if (more > 0) {
    const cell = el("td", more + " more workers not shown", "muted");
    cell.colSpan = 9;
    const row = el("tr");
    row.append(cell);
    body.append(row);
  }
}

function percentile(sorted, p) {
  if (!sorted.length) return NaN;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i];
}

// Rounds past warm-up: the first tenth of the rounds (at least the first round) is left out,
// as first rounds carry data loading and cold caches.
function afterWarmUp(rounds) {
  const warm = Math.max(1, Math.floor(rounds.length / 10));
  return rounds.length > warm ? rounds.slice(warm) : rounds;
}

function renderStats(rounds) {
  const box = document.getElementById("percentiles");
  box.replaceChildren();
  const warning = document.getElementById("warning");
  warning.hidden = true;
  if (!rounds.length) { box.append(el("span", "no round committed yet", "muted")); return; }
  const steady = afterWarmUp(rounds);
  const totals = steady.map((r) => r.latency.total_ms).sort((a, b) => a - b);
  for (const p of [50, 95, 99]) {
    const s = el("span");
    s.append(el("span", "P" + p + " round "), el("b", fmt(percentile(totals, p))));
    box.append(s);
  }
  box.append(el("span", "over " + steady.length + " of " + rounds.length + " rounds (warm-up left out)", "muted"));
  const last = rounds[rounds.length - 1];
  const wire = el("span");
  wire.append(el("span", "last round on the wire: updates "), el("b", kib(last.upload_bytes)), el("span", ", models "),
              el("b", kib(last.download_bytes)));
  box.append(wire);
  const comm = steady.map((r) => (r.latency.distribution_ms + r.latency.upload_ms) / Math.max(1e-9, r.latency.total_ms));
  const share = comm.sort((a, b) => a - b)[Math.floor(comm.length / 2)];
  if (share > COMMUNICATION_WARNING) {
    warning.hidden = false;
    warning.textContent = "Communication is " + (100 * share).toFixed(0) + "% of a median round (distribution and upload), over the " +
      (100 * COMMUNICATION_WARNING) + "% past which compute waits on the network: fewer, larger rounds (more local epochs) or a smaller model update ([compression] in the job) would help.";
  }
}

function chart(id, opts, data) {
  const holder = document.getElementById(id);
  const width = Math.max(320, Math.min(640, holder.parentElement.parentElement.clientWidth / 2 - 20));
  if (charts[id]) charts[id].destroy();
  holder.replaceChildren();
  charts[id] = new uPlot({ width, height: 240, ...opts }, data, holder);
}

function renderCharts(rounds) {
  const x = rounds.map((r) => r.round);
  // Stacked: each series is the sum of the phases up to it, filled down to the one below.
  const data = [x];
  const series = [{ label: "round" }];
  let running = rounds.map(() => 0);
  for (const [key, label, color] of PHASES) {
    running = running.map((v, i) => v + (rounds[i].latency[key] || 0));
    data.push(running.slice());
    series.push({ label, stroke: color, fill: color + "55", value: (u, v, si, i) => i == null ? "-" : fmt((rounds[i].latency[key] || 0)) });
  }
  const bands = PHASES.slice(1).map((_, i) => ({ series: [i + 2, i + 1] }));
  chart("latency-chart", { series, bands, axes: [{ label: "round" }, { label: "ms" }], scales: { x: { time: false } } }, data);
  chart("accuracy-chart", {
    series: [{ label: "round" },
             { label: "accuracy %", stroke: "#1a7f37", scale: "%" },
             { label: "loss", stroke: "#cf222e", scale: "loss" }],
    axes: [{ label: "round" }, { scale: "%", label: "accuracy %" }, { scale: "loss", side: 1, label: "loss", grid: { show: false } }],
    scales: { x: { time: false } },
  }, [x, rounds.map((r) => 100 * r.test_accuracy), rounds.map((r) => r.test_loss)]);
}

function renderTimeline(rounds) {
  const select = document.getElementById("round-select");
  const previous = selectedRound;
  select.replaceChildren();
  for (const r of rounds) select.append(new Option(String(r.round), String(r.round)));
  if (!rounds.length) { document.getElementById("timeline").replaceChildren(); return; }
  const latest = rounds[rounds.length - 1].round;
  selectedRound = !followLatest && previous !== null && rounds.some((r) => r.round === previous) ? previous : latest;
  select.value = String(selectedRound);
  const round = rounds.find((r) => r.round === selectedRound);
  const box = document.getElementById("timeline");
  box.replaceChildren();
  const total = Math.max(1e-9, round.latency.total_ms);
  const start = round.latency.selection_ms || 0;
  let slowest = null;
  let slowestMs = -1;
  const busy = (w) => (w.download_ms || 0) + (w.data_load_ms || 0) + (w.compute_ms || 0) + (w.upload_ms || 0);
  for (const w of round.workers || []) {
    if (w.outcome.startsWith("accepted") && busy(w) > slowestMs) { slowest = w; slowestMs = busy(w); }
  }
  const legend = el("div", null, "legend muted");
  for (const [cls, label] of [["download", "download"], ["load", "data loading"], ["compute", "compute"], ["upload", "upload"], ["dropped", "dropped"]]) {
    const swatch = el("span", null, "seg " + cls);
    swatch.style.position = "static";
    legend.append(swatch, document.createTextNode(label));
  }
  const summary = el("span", "round " + round.round + ": " + fmt(total) + " in all; critical path: " +
                            (round.latency.critical_worker || "-"));
  summary.style.marginLeft = "1.5em";
  legend.append(summary);
  box.append(legend);
  const segment = (bar, cls, from, ms) => {
    const seg = el("div", null, "seg " + cls);
    seg.style.left = Math.max(0, 100 * from / total) + "%";
    seg.style.width = Math.max(0.2, 100 * ms / total) + "%";
    seg.title = cls + " " + fmt(ms);
    bar.append(seg);
  };
  for (const w of round.workers || []) {
    const row = el("div", null, "row" + (w === slowest ? " slowest" : ""));
    row.dataset.worker = w.worker_id;
    const name = w.cohort ? w.cohort + " (cohort)" : w.worker_id;
    const bar = el("div", null, "bar");
    const dropped = String(w.outcome || "").startsWith("dropped");
    // On the coordinator's clock: laid back from where its update arrived (upload, compute,
    // data loading, download), none before the tasks went out; a worker that did not report,
    // from where its download ended.
    if (w.reported_ms > 0) {
      let end = start + w.reported_ms;
      for (const [key, cls] of [["upload_ms", "upload"], ["compute_ms", "compute"], ["data_load_ms", "load"], ["download_ms", "download"]]) {
        const from = Math.max(start, end - (w[key] || 0));
        segment(bar, cls, from, end - from);
        end = from;
      }
    } else if (w.download_done_ms > 0) {
      const from = Math.max(start, start + w.download_done_ms - (w.download_ms || 0));
      segment(bar, "download", from, start + w.download_done_ms - from);
    }
    if (dropped) {
      const from = start + (w.download_done_ms || 0);
      segment(bar, "dropped", from, Math.max(0, total - from));
    }
    let note = w.outcome + ", busy " + fmt(busy(w));
    if (w === slowest) note = "slowest: " + w.worker_id + (w.worker_id === round.latency.critical_worker ? " (critical path)" : "") + ", " + note;
    else if (w.worker_id === round.latency.critical_worker) note = "critical path (last report), " + note;
    if (dropped) note = (String(w.outcome).startsWith("dropped: over-selected") ? "over-selected, cancelled: " : "straggler: ") + note;
    row.append(el("div", name, "name"), bar, el("div", note, "note"));
    box.append(row);
  }
  if (round.reports_left_out) {
    box.append(el("div", round.reports_left_out + " more workers not shown (the round's first " +
                         (round.workers || []).length + " are, the critical path among them)", "muted"));
  }
}

async function loadJob(id) {
  const request = ++jobRequests;
  if (roundCache.id !== id) roundCache = { id, rounds: [] };
  let view;
  for (let page = 0; page < 10000; ++page) {
    // From the newest round fetched, asked for again: a job moved back to an earlier round
    // (its newer checkpoints were damaged, after a restart) has deleted it, or committed it
    // anew at another time, and the rounds fetched are then fetched again from the first.
    const cached = roundCache.rounds;
    const newest = cached.length ? cached[cached.length - 1] : null;
    const from = newest ? newest.round : 0;
    view = await (await api("/api/job?id=" + encodeURIComponent(id) + "&from=" + from)).json();
    if (id !== selectedJob || request !== jobRequests) return;
    if (newest && roundCache.rounds[roundCache.rounds.length - 1] === newest) {
      const again = (view.rounds || []).find((r) => r.round === newest.round);
      if (!again || again.committed_unix_ms !== newest.committed_unix_ms) {
        roundCache.rounds = [];
        continue;
      }
    }
    const last = roundCache.rounds.length ? roundCache.rounds[roundCache.rounds.length - 1].round : 0;
    // A round of more workers than a reply carries comes with its first reports (the critical
    // path's among them) and the count of the others.
    const leftOut = new Map((view.reports_left_out || []).map((x) => [x.round, x.count]));
    for (const r of view.rounds || []) {
      if (leftOut.has(r.round)) r.reports_left_out = leftOut.get(r.round);
      if (r.round > last) roundCache.rounds.push(r);  // another load may have taken them already
    }
    if (!view.next_round) break;
  }
  // A job moved back to an earlier round since the last page: its later rounds are gone.
  roundCache.rounds = roundCache.rounds.filter((r) => r.round <= view.job.rounds_committed);
  view.rounds = roundCache.rounds;
  jobView = view;
  const rounds = view.rounds;
  const job = view.job;
  document.getElementById("job").hidden = false;
  document.getElementById("job-title").textContent =
    job.id + " — " + (job.spec ? job.spec.name : "") + " (" + stateName(job.state) + ", " +
    job.rounds_committed + " of " + (job.spec ? job.spec.rounds : "?") + " rounds)" + (job.error ? ": " + job.error : "");
  renderStats(rounds);
  renderCharts(rounds);
  renderTimeline(rounds);
}

// Server-sent events read with fetch (so that the Authorization header goes too). A stream
// that fails is asked for again after 1 s, then 2, 4... up to 30 s; one the server ended
// with an error event (the job is gone, the caller's credential no longer holds), or that
// was refused (401, 403), is not asked for again: the status line says why.
async function follow(id) {
  if (streamAbort) streamAbort.abort();
  const abort = new AbortController();
  streamAbort = abort;
  let wait = 1000;
  while (!abort.signal.aborted) {
    try {
      const headers = token() ? { Authorization: "Bearer " + token() } : {};
      const response = await fetch("/api/events?job=" + encodeURIComponent(id), { headers, signal: abort.signal });
      if (response.status === 401 || response.status === 403) {
        setStatus("events refused (" + response.status + "): " + (await response.text()).slice(0, 300));
        return;
      }
      if (!response.ok) throw new Error("events: " + response.status);
      setStatus("live");
      wait = 1000;
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const frame = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          if (/^event: job$/m.test(frame)) {
            loadJob(id).catch(() => {});
            loadJobs().catch(() => {});
            loadWorkers().catch(() => {});
          } else if (/^event: end$/m.test(frame)) {
            setStatus("job ended");  // it changes no more: nothing left to follow
            return;
          } else if (/^event: error$/m.test(frame)) {
            const data = frame.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join(" ");
            setStatus("events stopped: " + data.slice(0, 300));
            return;
          }
        }
      }
    } catch (e) {
      if (abort.signal.aborted) return;
      setStatus("reconnecting…");
    }
    await new Promise((r) => setTimeout(r, wait));
    wait = Math.min(wait * 2, 30000);
  }
}

function selectJob(id) {
  if (selectedJob === id) return;
  selectedJob = id;
  selectedRound = null;
  followLatest = true;
  for (const row of document.querySelectorAll("#jobs tbody tr")) row.classList.toggle("selected", row.dataset.job === id);
  loadJob(id).catch((e) => setStatus(e.message));
  follow(id);
}

async function refresh() {
  try {
    await Promise.all([loadJobs(), loadWorkers()]);
    if (!streamAbort) setStatus("connected");
  } catch (e) {
    setStatus(e.message);
  }
}

document.getElementById("round-select").addEventListener("change", (e) => {
  selectedRound = Number(e.target.value);
  const rounds = jobView ? jobView.rounds || [] : [];
  followLatest = !rounds.length || selectedRound === rounds[rounds.length - 1].round;
  if (jobView) renderTimeline(rounds);
});
document.getElementById("login").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem("tessera-admin-token", document.getElementById("token").value.trim());
  document.getElementById("login").hidden = true;
  refresh();
  if (selectedJob) follow(selectedJob);
});
refresh();
setInterval(refresh, 2000);
