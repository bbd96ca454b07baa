// The dashboard's cache of a job's rounds (server/dashboard/dashboard.js, loadJob) against a
// scripted /api/job, in node without a browser: the page's script runs in a context whose
// document, charts and timers do nothing. Checks that a job moved back to an earlier round
// (its newer checkpoints were damaged) and whose rounds were run again shows the rounds as the
// coordinator now has them, not those it fetched before the coordinator restarted, whether
// the job has run again past the rounds fetched or not yet reached them.
//
//   node dashboard_rounds_test.mjs DASHBOARD_JS
import { readFileSync } from "node:fs";
import vm from "node:vm";

const [scriptPath] = process.argv.slice(2);
if (!scriptPath) {
  console.error("usage: node dashboard_rounds_test.mjs DASHBOARD_JS");
  process.exit(2);
}

// Whatever the page asks of the DOM or the charts: callable, constructible, every property
// itself, assignable.
const inert = new Proxy(function () {}, {
  get: (target, key) => (key === "then" ? undefined : key === Symbol.toPrimitive ? () => "" : inert),
  set: () => true,
  apply: () => inert,
  construct: () => inert,
});

// The job's rounds as the coordinator holds them; /api/job answers from them.
let job = null;
let stored = [];
function round(r, committed) {
  return { round: r, committed_unix_ms: String(committed), test_accuracy: 0.5, test_loss: 1, latency: { total_ms: 1 },
           workers: [] };
}
async function fetchStub(path) {
  const url = new URL(path, "http://dashboard.test");
  if (url.pathname !== "/api/job") return { ok: true, status: 200, json: async () => ({}), text: async () => "" };
  const from = Number(url.searchParams.get("from"));
  const view = { job, rounds: stored.filter((r) => r.round >= from), next_round: 0 };
  return { ok: true, status: 200, json: async () => JSON.parse(JSON.stringify(view)), text: async () => "" };
}

const context = vm.createContext({
  document: inert, sessionStorage: { getItem: () => "" }, fetch: fetchStub, setInterval: () => 0,
  setTimeout: () => 0, uPlot: inert, Option: inert, AbortController, TextDecoder, URL, Map, console,
});
vm.runInContext(readFileSync(scriptPath, "utf8"), context, { filename: scriptPath });

async function load() {
  vm.runInContext("selectedJob = 'job-1-a'", context);
  await vm.runInContext("loadJob('job-1-a')", context);
  return vm.runInContext("roundCache.rounds", context).map((r) => r.round + "@" + r.committed_unix_ms).join(" ");
}

let failed = 0;
function expectEqual(actual, expected, what) {
  if (actual !== expected) {
    console.error(`FAIL ${what}: got "${actual}", expected "${expected}"`);
    ++failed;
  } else {
    console.log(`ok ${what}`);
  }
}

// Rounds 1 to 3 committed and fetched.
job = { id: "job-1-a", rounds_committed: 3, state: "JOB_RUNNING", spec: { rounds: 10 } };
stored = [round(1, 100), round(2, 200), round(3, 300)];
expectEqual(await load(), "1@100 2@200 3@300", "the rounds committed");

// The coordinator restarted, went back to round 1 and has run rounds 2 to 4 again.
job = { ...job, rounds_committed: 4 };
stored = [round(1, 100), round(2, 1200), round(3, 1300), round(4, 1400)];
expectEqual(await load(), "1@100 2@1200 3@1300 4@1400", "rounds run again past those fetched");

// Again, and this time only round 2 has been run again when the page loads.
job = { ...job, rounds_committed: 2 };
stored = [round(1, 100), round(2, 2200)];
expectEqual(await load(), "1@100 2@2200", "a round run again before those fetched");

// Nothing moved back: the rounds fetched stay, the new ones are added.
job = { ...job, rounds_committed: 3 };
stored = [round(1, 100), round(2, 2200), round(3, 2300)];
expectEqual(await load(), "1@100 2@2200 3@2300", "a round committed after those fetched");

process.exit(failed ? 1 : 0);
