// The coordinator's dashboard in a real browser: a coordinator (--insecure on loopback, with an
// admin token and --metrics-listen 127.0.0.1:0), three workers and a small MLP job, the page in
// headless chromium driven by puppeteer-core. Checks, in the page:
//   - it loads and asks for the admin token; after signing in, no console error and no
//     uncaught exception (before it, only the expected 401s);
//   - the workers table lists the three workers, and at the end each one's compute in the
//     last round;
//   - the jobs table shows the job once submitted, and its committed rounds reach the latency
//     chart and the percentiles while the job runs: the count is seen to grow at least twice
//     before the job ends, then to equal the job's rounds;
//   - the last round's timeline marks as `slowest` the worker whose download + data loading +
//     compute + upload is the largest in /api/job's last round, and notes the round's critical
//     path (the accepted report that arrived last, as /api/job names it) on that worker's row.
// Then saves a screenshot. Asserts no timing.
//
//   node dashboard_test.mjs COORDINATOR_BIN WORKER_BIN CLI_BIN SCREENSHOT_PNG
// Environment: CHROMIUM (default: chromium on PATH), KEEP_TEST_DIR=1 to keep the logs.
import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import puppeteer from "puppeteer-core";

const [coordinatorBin, workerBin, cliBin, screenshotPath] = process.argv.slice(2);
if (!screenshotPath) {
  console.error("usage: node dashboard_test.mjs COORDINATOR_BIN WORKER_BIN CLI_BIN SCREENSHOT_PNG");
  process.exit(2);
}
// Enough rounds that the page, which may render its first chart only seconds after the
// submit on a loaded machine, still sees the job running with the chart growing: with 10
// rounds of about 150 ms, a run beside the rest of the suite first drew the chart at 8.
const ROUNDS = 30;
const WORKERS = ["dash-a", "dash-b", "dash-c"];
const ADMIN_TOKEN = "dashboard-test-admin-" + process.pid;
const dir = mkdtempSync(join(tmpdir(), "dashboard-test."));
const children = [];
let browser = null;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

class TestFailure extends Error {}
function expect(condition, message) {
  if (!condition) throw new TestFailure(message);
}

function start(name, bin, args) {
  const log = openSync(join(dir, name + ".log"), "w");
  const child = spawn(bin, args, {
    stdio: ["ignore", log, log],
    env: { ...process.env, OPENBLAS_NUM_THREADS: "1" },
  });
  child.logName = name;
  child.exited = null;
  child.on("exit", (code, signal) => { child.exited = signal || code; });
  children.push(child);
  return child;
}

function log(name) {
  try { return readFileSync(join(dir, name + ".log"), "utf8"); } catch { return ""; }
}

// Waits for `pattern` in a child's log; returns the match.
async function waitForLine(child, pattern, what, timeoutMs = 30000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const m = log(child.logName).match(pattern);
    if (m) return m;
    expect(child.exited === null, `${child.logName} exited (${child.exited}) before ${what}`);
    expect(Date.now() < deadline, `${child.logName} did not print ${what} within ${timeoutMs / 1000} s`);
    await sleep(100);
  }
}

async function waitFor(condition, what, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await condition();
    if (value) return value;
    expect(Date.now() < deadline, `${what}: not within ${timeoutMs / 1000} s`);
    await sleep(150);
  }
}

async function stopChildren() {
  for (const child of children) if (child.exited === null) child.kill("SIGTERM");
  const deadline = Date.now() + 10000;
  while (children.some((c) => c.exited === null) && Date.now() < deadline) await sleep(100);
  for (const child of children) if (child.exited === null) child.kill("SIGKILL");
}

async function main() {
  writeFileSync(join(dir, "join-token"), "dashboard-test-join\n");
  writeFileSync(join(dir, "admin-token"), ADMIN_TOKEN + "\n", { mode: 0o600 });
  writeFileSync(join(dir, "job.toml"), `name = "dashboard-test"
rounds = ${ROUNDS}
round_deadline_s = 120
seed = 5

[model]
name = "mlp"
hidden = [64]

[data]
max_train_samples = 18000
max_test_samples = 1000

[data.partition]
kind = "iid"
parties = ${WORKERS.length}

[train]
local_epochs = 3
batch_size = 32
learning_rate = 0.05
momentum = 0.9
`);

  const coordinator = start("coordinator", coordinatorBin, [
    "--listen", "127.0.0.1:0", "--state-dir", join(dir, "state"), "--insecure",
    "--join-token-file", join(dir, "join-token"), "--admin-token-file", join(dir, "admin-token"),
    "--metrics-listen", "127.0.0.1:0"]);
  const port = (await waitForLine(coordinator, /listening on port (\d+)/, "its port"))[1];
  const base = (await waitForLine(coordinator, /dashboard and metrics at (\S+)\/ and /, "its dashboard's URL"))[1];
  console.log(`coordinator on port ${port}, dashboard at ${base}/`);

  const headers = { Authorization: "Bearer " + ADMIN_TOKEN };
  const getJson = async (path) => {
    const response = await fetch(base + path, { headers });
    if (!response.ok) throw new TestFailure(`${path}: ${response.status} ${await response.text()}`);
    return response.json();
  };
  const unauthorized = await fetch(base + "/api/jobs");
  expect(unauthorized.status === 401, `/api/jobs without a token: expected 401, got ${unauthorized.status}`);

  for (const name of WORKERS) {
    start(name, workerBin, ["--coordinator", "127.0.0.1:" + port, "--name", name, "--insecure",
                            "--join-token-file", join(dir, "join-token")]);
  }
  await waitFor(async () => {
    const workers = (await getJson("/api/workers")).workers || [];
    return WORKERS.every((n) => workers.some((w) => w.worker_id === n && w.alive));
  }, "the three workers alive in /api/workers", 60000);

  const root = process.getuid && process.getuid() === 0;
  browser = await puppeteer.launch({
    executablePath: process.env.CHROMIUM || "chromium",
    headless: true,
    args: [...(root ? ["--no-sandbox"] : []), "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
           "--user-data-dir=" + join(dir, "chromium")],
  });
  const page = await browser.newPage();
  await page.setViewport({ width: 1360, height: 1000 });
  let signedIn = false;
  const consoleErrors = [];
  page.on("console", (message) => {
    if (message.type() !== "error") return;
    const text = message.text();
    const where = message.location() && message.location().url ? " (" + message.location().url + ")" : "";
    // Before signing in the page's first requests are refused: that is how it learns to ask.
    if (!signedIn && /status of 401/.test(text)) return;
    consoleErrors.push(text + where);
  });
  page.on("pageerror", (error) => consoleErrors.push("uncaught: " + error.message));
  page.on("requestfailed", (request) => {
    const failure = request.failure() ? request.failure().errorText : "";
    // The page aborts an event stream when it switches jobs; nothing else may fail.
    if (failure !== "net::ERR_ABORTED") consoleErrors.push("request failed: " + request.url() + " " + failure);
  });

  await page.goto(base + "/", { waitUntil: "load" });
  await page.waitForSelector("#login:not([hidden])", { timeout: 15000 });
  await page.type("#token", ADMIN_TOKEN);
  await page.click("#login button[type=submit]");
  await page.waitForSelector("#login", { hidden: true, timeout: 15000 });
  signedIn = true;

  // The workers table: each worker by name, alive.
  await waitFor(() => page.evaluate((names) => {
    const rows = [...document.querySelectorAll("#workers tbody tr")];
    return rows.length === names.length &&
      names.every((n) => rows.some((r) => r.cells[0].textContent === n && r.cells[1].textContent !== "" &&
                                          !r.cells[1].textContent.startsWith("gone")));
  }, WORKERS), "the workers table listing the three workers", 15000);
  console.log("workers table: " + WORKERS.join(", "));

  // Submit, then follow the page as the rounds commit.
  const submit = spawnSync(cliBin, ["--coordinator", "127.0.0.1:" + port, "--insecure",
                                    "--admin-token-file", join(dir, "admin-token"), "submit", join(dir, "job.toml")],
                           { encoding: "utf8", timeout: 30000 });
  expect(submit.status === 0, `tessera submit failed (${submit.status}): ${submit.stdout}${submit.stderr}`);
  const jobs = (await getJson("/api/jobs")).jobs || [];
  expect(jobs.length === 1, `expected one job in /api/jobs, got ${jobs.length}`);
  const jobId = jobs[0].id;
  console.log("submitted " + jobId);

  // What the page shows, read from its DOM and its latency chart's data.
  const shown = () => page.evaluate((id) => {
    const row = document.querySelector(`#jobs tbody tr[data-job="${id}"]`);
    const percentiles = document.getElementById("percentiles").textContent;
    const over = percentiles.match(/over \d+ of (\d+) rounds/);
    // The chart's own data: `charts` is the page's global of uPlot instances.
    const chart = typeof charts !== "undefined" && charts["latency-chart"];
    return {
      state: row ? row.cells[2].textContent : null,
      jobRounds: row ? row.cells[3].textContent : null,
      percentileRounds: over ? Number(over[1]) : 0,
      chartRounds: chart ? chart.data[0].length : 0,
      canvas: !!document.querySelector("#latency-chart canvas"),
      options: document.querySelectorAll("#round-select option").length,
    };
  }, jobId);

  const seenWhileRunning = new Set();
  const deadline = Date.now() + 240000;
  let last = null;
  for (;;) {
    const now = await shown();
    if (JSON.stringify(now) !== JSON.stringify(last)) console.log("page: " + JSON.stringify(now));
    last = now;
    const job = (await getJson("/api/job?id=" + jobId)).job;
    const committed = job.rounds_committed;
    expect(now.chartRounds <= committed && now.percentileRounds <= committed,
           `the page shows more rounds than committed (${committed}): ${JSON.stringify(now)}`);
    if (job.state === "JOB_RUNNING" && now.state === "running" && now.chartRounds > 0 &&
        now.chartRounds === now.percentileRounds && now.chartRounds < ROUNDS) {
      seenWhileRunning.add(now.chartRounds);
    }
    if (job.state !== "JOB_RUNNING" && job.state !== "JOB_PENDING" && now.state !== "running" &&
        now.state !== "pending" && now.chartRounds === committed) {
      expect(job.state === "JOB_SUCCEEDED", `job ${jobId} ended ${job.state}: ${job.error}`);
      break;
    }
    expect(Date.now() < deadline, `job ${jobId} not finished in the page within 240 s: ${JSON.stringify(now)}`);
    await sleep(150);
  }
  console.log("round counts seen in the chart and percentiles while running: " + [...seenWhileRunning].join(" "));
  expect(seenWhileRunning.size >= 2,
         `expected the chart and percentiles to grow while the job ran (two counts or more between 1 and ${ROUNDS - 1}), saw ${[...seenWhileRunning]}`);
  expect(last.chartRounds === ROUNDS && last.percentileRounds === ROUNDS && last.options === ROUNDS && last.canvas,
         `at the end: expected ${ROUNDS} rounds in the chart, the percentiles and the round list: ${JSON.stringify(last)}`);
  expect(last.state === "succeeded" && last.jobRounds === `${ROUNDS}/${ROUNDS}`,
         `jobs table: expected succeeded, ${ROUNDS}/${ROUNDS}: ${JSON.stringify(last)}`);

  // The critical path of the last round, by /api/job, against the page's timeline.
  const view = await getJson("/api/job?id=" + jobId);
  const lastRound = view.rounds[view.rounds.length - 1];
  let expected = null;
  let expectedMs = -1;
  for (const w of lastRound.workers) {
    const ms = w.download_ms + w.data_load_ms + w.compute_ms + w.upload_ms;
    if (w.outcome === "accepted" && ms > expectedMs) { expected = w.worker_id; expectedMs = ms; }
  }
  expect(expected !== null, `round ${lastRound.round}: no accepted worker in /api/job`);
  const timeline = await page.evaluate(() => ({
    round: document.getElementById("round-select").value,
    rows: [...document.querySelectorAll("#timeline .row")].map((r) => r.dataset.worker),
    slowest: [...document.querySelectorAll("#timeline .row.slowest")].map((r) => ({
      worker: r.dataset.worker, note: r.querySelector(".note").textContent })),
  }));
  console.log(`round ${lastRound.round}: slowest by /api/job ${expected} (${expectedMs.toFixed(1)} ms); page: ` +
              JSON.stringify(timeline.slowest));
  expect(timeline.round === String(lastRound.round), `timeline shows round ${timeline.round}, expected ${lastRound.round}`);
  expect(timeline.rows.length === lastRound.workers.length,
         `timeline: ${timeline.rows.length} rows, /api/job has ${lastRound.workers.length} workers`);
  expect(timeline.slowest.length === 1, `timeline: expected one row of class slowest, got ${timeline.slowest.length}`);
  expect(timeline.slowest[0].worker === expected,
         `timeline: slowest row is ${timeline.slowest[0].worker}, /api/job says ${expected}`);
  expect(timeline.slowest[0].note.startsWith(`slowest: ${expected}`),
         `timeline: slowest note is "${timeline.slowest[0].note}"`);
  const critical = lastRound.latency.critical_worker;
  expect(critical, `round ${lastRound.round}: /api/job names no critical worker`);
  const criticalNote = await page.evaluate((w) => {
    const row = document.querySelector(`#timeline .row[data-worker="${w}"]`);
    return row ? row.querySelector(".note").textContent : null;
  }, critical);
  expect(criticalNote !== null && criticalNote.includes("critical path"),
         `timeline: the row of the critical worker ${critical} says "${criticalNote}"`);

  // The workers table says what each did last: its compute in the job's newest round.
  await waitFor(() => page.evaluate((rounds) => {
    const rows = [...document.querySelectorAll("#workers tbody tr")];
    return rows.length > 0 && rows.every((r) => r.cells[7].textContent.endsWith(`(round ${rounds})`));
  }, ROUNDS), "the workers table showing each worker's compute in the last round", 15000);

  await sleep(300);  // let the last render settle
  await page.screenshot({ path: screenshotPath, fullPage: true });
  console.log("screenshot: " + screenshotPath);

  // A stream the server ends with an error (a job that is not there) is not asked for again.
  const eventRequests = [];
  page.on("request", (request) => {
    if (request.url().includes("/api/events?job=job-404-000000")) eventRequests.push(Date.now());
  });
  await page.evaluate(() => { follow("job-404-000000"); });
  await waitFor(() => page.evaluate(() => document.getElementById("status").textContent.startsWith("events stopped: ")),
                "the status line saying why the events stopped", 15000);
  await sleep(3500);  // the page asked again every second before
  const status = await page.evaluate(() => document.getElementById("status").textContent);
  console.log(`after an error event: ${eventRequests.length} request(s); status "${status}"`);
  expect(eventRequests.length === 1, `an event stream ended by an error was asked for ${eventRequests.length} times`);
  expect(consoleErrors.length === 0, "console errors:\n  " + consoleErrors.join("\n  "));
}

let failed = false;
try {
  await main();
  console.log("PASS");
} catch (error) {
  failed = true;
  console.log("FAIL: " + (error instanceof TestFailure ? error.message : error.stack));
  for (const child of [{ logName: "coordinator" }, ...children.slice(1)]) {
    console.log(`--- ${child.logName}.log (last lines)`);
    console.log(log(child.logName).split("\n").slice(-25).join("\n"));
  }
} finally {
  if (browser) await browser.close().catch(() => {});
  await stopChildren();
  if (process.env.KEEP_TEST_DIR === "1") console.log("kept " + dir);
  else rmSync(dir, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
