// Browser tests of the operator console (issue #13) in headless Debian Chromium, driven by
// playwright-core. The server, a failing test worker and the webhook sender are the real binary
// (target/debug/trigger-bridge, built by `cargo test --workspace`). Screenshots go to
// target/browser-screenshots/ (not committed). Run: tests/browser/run.sh
//
// Every wait is bounded (playwright's expect-style waits with a timeout); nothing sleeps blindly.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtempSync, writeFileSync, mkdirSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, "../..");
const BIN = process.env.TRIGGER_BRIDGE_BIN || join(repo, "target/debug/trigger-bridge");
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const SHOTS = join(repo, "target/browser-screenshots");
const DOC_SHOTS = process.env.DOC_SCREENSHOTS; // set to docs/images to refresh the committed pictures
const GH_SECRET = "browser-github-secret";
const SW_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const OPS_KEY = "ops-browser-key-0123456789";
const VIEW_KEY = "viewer-browser-key-0123456789";
const WAIT = 20_000; // the longest any one condition may take, ms

mkdirSync(SHOTS, { recursive: true });
const sha = (s) => createHash("sha256").update(s).digest("hex");

function freePort() {
  return new Promise((ok) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const p = s.address().port;
      s.close(() => ok(p));
    });
  });
}

let server, worker, browser, base, workerPort, dir;
const pageErrors = [];

async function waitHealthy(url) {
  const until = Date.now() + WAIT;
  while (Date.now() < until) {
    try {
      const r = await fetch(url);
      if (r.ok) return;
    } catch {}
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`${url} did not answer within ${WAIT} ms`);
}

async function api(path, init = {}) {
  const r = await fetch(base + path, {
    ...init,
    headers: { authorization: `Bearer ${OPS_KEY}`, "content-type": "application/json", ...(init.headers || {}) },
  });
  const text = await r.text();
  return { status: r.status, body: text ? JSON.parse(text) : null };
}

async function until(what, f) {
  const end = Date.now() + WAIT;
  let last;
  while (Date.now() < end) {
    last = await f();
    if (last) return last;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${what}: not reached within ${WAIT} ms`);
}

function send(sub, connector, file, extra = []) {
  const args = ["send", "--url", `${base}/v1/trigger-subscriptions/${sub}/ingest`, "--connector", connector,
    "--secret", connector === "github" ? GH_SECRET : SW_SECRET, "--file", join(repo, file), "--json", ...extra];
  return JSON.parse(execFileSync(BIN, args, { encoding: "utf8" }));
}

// The pictures docs/console.md and the README show.
const DOC_NAMES = new Set(["subscriptions", "receipt", "run-wait-resolved", "overview-phone"]);

async function shot(page, name) {
  await page.screenshot({ path: join(SHOTS, `${name}.png`) });
  if (DOC_SHOTS && DOC_NAMES.has(name)) await page.screenshot({ path: join(repo, DOC_SHOTS, `${name}.png`) });
}

// Every visible form control has a name a screen reader can say (a <label> around it or for it, or
// aria-label), and every image-like element a text: checked on the pages the tests visit.
async function labelled(page) {
  const missing = await page.evaluate(() =>
    [...document.querySelectorAll("input:not([type=hidden]), select, textarea, button, svg[role=img]")]
      .filter((el) => {
        if (el.getAttribute("aria-label")) return false;
        if (el.tagName === "BUTTON") return !el.textContent.trim();
        if (el.tagName.toLowerCase() === "svg") return !el.querySelector("title");
        return !(el.closest("label") || (el.id && document.querySelector(`label[for="${el.id}"]`)));
      })
      .map((el) => el.outerHTML.slice(0, 120)));
  assert.deepEqual(missing, [], `unlabelled controls on ${page.url()}`);
}

async function login(key, viewport = { width: 1280, height: 800 }) {
  const context = await browser.newContext({ viewport, baseURL: base, timezoneId: "Europe/Berlin" });
  const page = await context.newPage();
  // A script error or a refused resource (the content security policy) fails the test that saw it.
  page.on("console", (m) => { if (m.type() === "error") pageErrors.push(`${page.url()}: ${m.text()}`); });
  page.on("pageerror", (e) => pageErrors.push(`${page.url()}: ${e.message}`));
  await page.goto("/ui");
  assert.match(page.url(), /\/ui\/login\?next=/);
  await page.getByLabel("API key").fill(key);
  await page.getByRole("button", { name: "Log in" }).click();
  await page.waitForURL(/\/ui$/);
  return { context, page };
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "tb-browser-"));
  const port = await freePort();
  workerPort = await freePort();
  base = `http://127.0.0.1:${port}`;
  const config = `
[server]
listen = "127.0.0.1:${port}"
data_dir = "${join(dir, "data")}"

[[api_keys]]
name = "ops"
sha256 = "${sha(OPS_KEY)}"
scopes = ["*"]

[[api_keys]]
name = "viewer"
sha256 = "${sha(VIEW_KEY)}"
scopes = ["operator:read"]

[[subscriptions]]
id = "github"
source = "webhook"
connector = "github"
secret = "env:GITHUB_WEBHOOK_SECRET"

[[subscriptions]]
id = "github-sessions"
source = "webhook"
connector = "github"
secret = "env:GITHUB_WEBHOOK_SECRET"

[[subscriptions]]
id = "flaky"
source = "webhook"
connector = "standard-webhooks"
secret = "env:STANDARD_WEBHOOK_SECRET"
failure_threshold = 2
failure_window_ms = 0
[subscriptions.retry]
max_attempts = 2
backoff = "fixed"
initial_ms = 100
max_ms = 100
jitter = 0.0

[[workflows]]
id = "noop"
executor = "noop"

[[workflows]]
id = "pr-session"
executor = "session"
[workflows.session]
agent = "pr-reviewer"
model = "approved-model"
namespace = "platform"

[[workflows]]
id = "flaky"
executor = "http"
url = "http://127.0.0.1:${workerPort}/run"
allow_private = true
secret = "env:STANDARD_WEBHOOK_SECRET"
timeout_ms = 5000

[[bindings]]
id = "pr-opened"
subscription = "github"
event_types = ["pull_request.opened"]
action = "start_run"
workflow = "noop"
inputs = { repository = "repository.full_name", number = "pull_request.number" }

[[bindings]]
id = "pr-session-start"
subscription = "github-sessions"
event_types = ["pull_request.opened"]
action = "start_run"
workflow = "pr-session"

[[bindings]]
id = "flaky-all"
subscription = "flaky"
event_types = ["*"]
action = "start_run"
workflow = "flaky"
`;
  const cfg = join(dir, "console.toml");
  writeFileSync(cfg, config);
  const env = { ...process.env, GITHUB_WEBHOOK_SECRET: GH_SECRET, STANDARD_WEBHOOK_SECRET: SW_SECRET, RUST_LOG: "warn" };
  worker = spawn(BIN, ["test-worker", "--listen", `127.0.0.1:${workerPort}`, "--fail", "--secret", SW_SECRET], { env, stdio: ["ignore", "ignore", "inherit"] });
  server = spawn(BIN, ["serve", "--config", cfg], { env, stdio: ["ignore", "ignore", "inherit"] });
  await waitHealthy(`${base}/health`);
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ["--no-sandbox"] });
});

after(async () => {
  await browser?.close();
  server?.kill("SIGTERM");
  worker?.kill("SIGTERM");
});

test("log in with an API key and see the overview", async () => {
  const { context, page } = await login(OPS_KEY);
  await page.getByRole("heading", { name: "Overview" }).waitFor();
  assert.equal(await page.locator("nav a[aria-current=page]").textContent(), "Overview");
  await page.locator("#live-state.live-on").waitFor({ timeout: WAIT }); // the live feed is connected
  await shot(page, "overview");
  await page.setViewportSize({ width: 390, height: 844 });
  await shot(page, "overview-phone");
  await context.close();
});

test("a subscription goes failed after a failing worker, live", async () => {
  const { context, page } = await login(OPS_KEY);
  await page.goto("/ui/subscriptions");
  const row = page.locator('tr[data-subscription="flaky"]');
  assert.match(await row.locator(".badge").first().textContent(), /active/);
  await page.locator("#live-state.live-on").waitFor({ timeout: WAIT });
  send("flaky", "standard-webhooks", "tests/fixtures/github/push/00.json");
  // No reload: the live region re-reads itself when the attempts commit.
  await row.locator(".badge", { hasText: "failed" }).waitFor({ timeout: WAIT });
  assert.match(await row.textContent(), /http_500/);
  await row.getByText("1 receipt · 2 of 2 attempts failed").waitFor({ timeout: WAIT }); // the sparkline's counts
  await labelled(page);
  await shot(page, "subscriptions");
  await context.close();
});

test("a GitHub delivery's receipt leads to its run and back", async () => {
  const delivery = "browser-gh-delivery-1";
  const sent = send("github", "github", "tests/fixtures/github/pull_request/00-opened.json", ["--event", "pull_request", "--delivery-id", delivery]);
  const { context, page } = await login(OPS_KEY);
  await page.goto("/ui/receipts");
  await page.getByLabel("Receipt id or sender's delivery id").fill(delivery);
  await page.getByRole("button", { name: "Search" }).click();
  const link = page.locator("table a", { hasText: /^rcpt_/ });
  assert.equal(await link.count(), 1);
  await link.click();
  await page.getByRole("heading", { name: /^Receipt rcpt_/ }).waitFor();
  const receiptUrl = page.url();
  assert.ok(receiptUrl.endsWith(`/ui/receipts/${sent.response.receiptId}`), receiptUrl);
  // The timeline runs from received to consumed, and names the binding it matched.
  await page.locator("ol.timeline li", { hasText: "consumed" }).first().waitFor({ timeout: WAIT });
  assert.match(await page.locator("ol.timeline").textContent(), /received[\s\S]*matched[\s\S]*pr-opened[\s\S]*attempted/);
  await labelled(page);
  // Times are in the viewer's zone (Europe/Berlin here), with the UTC time on hover.
  const t = page.locator("ol.timeline time").first();
  assert.match(await t.getAttribute("title"), / UTC$/);
  assert.notEqual(await t.textContent(), await t.getAttribute("datetime"));
  await shot(page, "receipt");
  await page.locator("a", { hasText: /^run_/ }).first().click();
  await page.getByRole("heading", { name: /^Run run_/ }).waitFor();
  assert.match(await page.locator("dl.facts").textContent(), /completed/);
  assert.match(await page.locator("dl.facts").textContent(), /evt_/); // causationId
  await shot(page, "run");
  await page.locator("dl.facts a", { hasText: /^rcpt_/ }).click();
  assert.equal(page.url(), receiptUrl);
  await context.close();
});

test("bulk replay of dead letters after the confirmation shows the new attempts", async () => {
  send("flaky", "standard-webhooks", "tests/fixtures/github/push/00.json");
  send("flaky", "standard-webhooks", "tests/fixtures/github/push/00.json");
  await until("three dead letters", async () => {
    const r = await api("/v1/deliveries?state=dead-lettered&subscription=flaky");
    return r.body.deliveries.length >= 3 && r.body.deliveries;
  });
  const { context, page } = await login(OPS_KEY);
  await page.goto("/ui/dead-letters?subscription=flaky");
  const boxes = page.locator("input[name=ids]");
  const n = await boxes.count();
  assert.ok(n >= 3, `${n} dead letters listed`);
  await page.getByLabel("Select every row").check();
  await labelled(page);
  await shot(page, "dead-letters");
  await page.getByRole("button", { name: "Replay selected…" }).click();
  const dialog = page.getByRole("alertdialog");
  assert.match(await dialog.textContent(), new RegExp(`Replay ${n} dead letters`));
  assert.match(await dialog.textContent(), /keeps its delivery id, its dedup key and its receipt/);
  await shot(page, "replay-confirm");
  await page.getByRole("button", { name: `Yes, replay ${n}` }).click();
  await page.getByRole("status").filter({ hasText: `${n} of ${n} replayed` }).waitFor();
  // Each has a new attempt: the worker still fails, so each is dead-lettered again after attempt 3.
  const id = await page.locator("tr[data-replayed] code").first().textContent();
  const d = await until("the replayed attempt", async () => {
    const r = await api(`/v1/deliveries/${id}`);
    return r.body.attempts.length === 3 && r.body.delivery.state === "dead-lettered" && r.body;
  });
  await page.goto(`/ui/receipts/${d.delivery.receiptId}`);
  const rows = page.locator(`section[id="${id}"] tbody tr`);
  assert.equal(await rows.count(), 3, "three attempts shown");
  assert.match(await page.locator(`section[id="${id}"]`).textContent(), /3 attempts, 1 replay\b/);
  await context.close();
});

test("raise a signal and see the wait resolve live", async () => {
  const sent = send("github-sessions", "github", "tests/fixtures/github/pull_request/00-opened.json", ["--event", "pull_request"]);
  const receipt = sent.response.receiptId;
  const runId = await until("the session run", async () => {
    const r = await api(`/v1/receipts/${receipt}`);
    return r.body?.deliveries?.[0]?.runId;
  });
  const armed = await api(`/v1/runs/${runId}/waits`, { method: "POST", body: JSON.stringify({ kind: "signal", names: ["ci.done"], timeoutMs: 600000, reason: "waiting for CI" }) });
  assert.equal(armed.status, 201, JSON.stringify(armed.body));
  const { context, page } = await login(OPS_KEY);
  await page.goto(`/ui/runs/${runId}`);
  const wait = page.locator(`tr[data-wait="${armed.body.waitId}"]`);
  await wait.locator(".badge", { hasText: "armed" }).waitFor();
  assert.match(await wait.locator("[data-deadline]").textContent(), /^in \d+ min/);
  await page.locator("#live-state.live-on").waitFor({ timeout: WAIT });
  await labelled(page);
  await shot(page, "run-wait-armed");
  // A second window raises the signal; the first one is never reloaded.
  const other = await context.newPage();
  await other.goto(`/ui/runs/${runId}`);
  await other.getByLabel(/Signal name/).fill("ci.done");
  await other.getByLabel(/Data/).fill("{not json");
  await other.getByRole("button", { name: "Raise…" }).click();
  assert.match(await other.locator("#raise-error").textContent(), /not JSON/);
  await other.getByLabel(/Data/).fill('{"conclusion": "success"}');
  await other.getByRole("button", { name: "Raise…" }).click();
  assert.match(await other.getByRole("alertdialog").textContent(), /Raise signal ci\.done/);
  await other.getByRole("button", { name: "Yes, raise ci.done" }).click();
  await other.getByRole("status").filter({ hasText: "raised" }).waitFor();
  await wait.locator(".badge", { hasText: "resolved" }).waitFor({ timeout: WAIT });
  assert.match(await wait.textContent(), /signal ci\.done sig_/);
  assert.doesNotMatch(await wait.textContent(), /conclusion/, "signal data is not shown");
  await shot(page, "run-wait-resolved");
  // The outcome stays through live refreshes, and a reload reads the page: it never raises again.
  await other.waitForTimeout(1500); // longer than the live feed's coalescing, so a refresh has happened
  assert.match(await other.getByRole("status").textContent(), /Signal ci\.done raised/);
  assert.match(other.url(), new RegExp(`/ui/runs/${runId}$`));
  await other.reload();
  await other.getByRole("heading", { name: "Mailbox" }).waitFor();
  assert.equal(await other.locator("h2:has-text('Mailbox') + p + table tbody tr").count(), 1, "one signal, not two");
  await context.close();
});

test("a read-only key sees no mutating control, and a forged form post is refused", async () => {
  const { context, page } = await login(VIEW_KEY);
  await page.goto("/ui/subscriptions");
  await page.locator('tr[data-subscription="github"]').waitFor();
  assert.equal(await page.getByRole("button", { name: /Pause|Resume/ }).count(), 0);
  await page.goto("/ui/dead-letters?subscription=flaky");
  assert.equal(await page.locator("input[name=ids]").count(), 0);
  assert.equal(await page.getByRole("button", { name: /Replay/ }).count(), 0);
  const runs = await api("/v1/runs?limit=50");
  const session = runs.body.runs.find((r) => r.workflowId === "pr-session");
  await page.goto(`/ui/runs/${session.runId}`);
  assert.equal(await page.getByRole("button", { name: "Raise…" }).count(), 0);
  await shot(page, "read-only");
  // Even with its own CSRF token, the read-only key cannot act.
  const csrf = await page.locator("body").getAttribute("data-csrf");
  const r = await context.request.post(`/ui/subscriptions/github/pause`, { form: { csrf, confirmed: "yes" }, maxRedirects: 0 });
  assert.equal(r.status(), 403);
  await context.close();

  // The operator's browser, a form post without the CSRF token (what another site would send): 403.
  const ops = await login(OPS_KEY);
  const forged = await ops.context.request.post(`/ui/subscriptions/github/pause`, { form: { confirmed: "yes" }, maxRedirects: 0 });
  assert.equal(forged.status(), 403);
  assert.match(await forged.text(), /csrf_failed/);
  const sub = await api("/v1/trigger-subscriptions/github");
  assert.equal((sub.body.subscription ?? sub.body).state, "active", "nothing changed");
  await ops.context.close();
});

test("the audit log holds every action of these tests and its chain verifies", async () => {
  const out = execFileSync(BIN, ["audit", "list", "--server", base, "--api-key", OPS_KEY, "--json", "--limit", "500"], { encoding: "utf8" });
  const entries = JSON.parse(out).entries;
  const count = (action) => entries.filter((e) => e.action === action && e.outcome === "ok").length;
  assert.ok(count("delivery.replay") >= 3, "each replayed dead letter");
  assert.equal(count("signal.raise"), 1);
  assert.equal(entries.find((e) => e.action === "signal.raise").actor, "ops");
  assert.ok(count("console.login") >= 7, "every login");
  assert.equal(count("subscription.pause"), 0, "the refused posts paused nothing");
  const verified = execFileSync(BIN, ["audit", "list", "--verify", "--server", base, "--api-key", OPS_KEY], { encoding: "utf8" });
  assert.match(verified, /audit log verified/);
  const { context, page } = await login(OPS_KEY);
  await page.goto("/ui/audit?verify=1");
  await page.getByRole("status").filter({ hasText: "The chain holds" }).waitFor();
  assert.ok((await page.locator("tbody tr").count()) >= 10);
  await labelled(page);
  await shot(page, "audit");
  await page.goto("/ui");
  await page.getByRole("heading", { name: "Overview" }).waitFor();
  await shot(page, "overview-after");
  await context.close();
});

test("no page logged a script error or a refused resource", () => {
  assert.deepEqual(pageErrors, []);
});
