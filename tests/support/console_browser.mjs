// The console's browser test (tests/it/console.rs): headless Chromium driven by
// puppeteer-core, as an operator would use the console. Given by the environment:
// CHROMIUM (the browser), BASE (lull's address), TOKEN (LULL_HTTP_TOKEN), CHAT (the
// chat's id), APPROVAL (a tool call's approval waiting for a yes), EXPIRED (a session
// cookie signed with the token, past its end), SHOTS (where to save a screenshot of
// each page). Prints one JSON object
// of what it saw; the Rust test checks it, and what lull did.
import { createRequire } from "node:module";
import path from "node:path";

const require = createRequire(path.join(process.env.LULL_PUPPETEER, "x.js"));
const puppeteer = require("puppeteer-core");

const { CHROMIUM, BASE, TOKEN, CHAT, APPROVAL, EXPIRED, SHOTS } = process.env;
const seen = {};
const browser = await puppeteer.launch({
  executablePath: CHROMIUM,
  headless: true,
  args: ["--no-sandbox", "--disable-gpu"],
});
try {
  const page = await browser.newPage();
  await page.setViewport({ width: 1200, height: 900 });
  const shot = (name) => page.screenshot({ path: path.join(SHOTS, `console-${name}.png`), fullPage: true });

  // Not logged in: the chats are behind the login form.
  let response = await page.goto(`${BASE}/chats`);
  seen.unauthenticated = response.status();
  await shot("login");
  await page.type("input[name=token]", TOKEN);
  await Promise.all([page.waitForNavigation(), page.click("#login button")]);
  seen.after_login = new URL(page.url()).pathname;
  await shot("overview");

  // The chats, then the chat: its model changed with the form.
  response = await page.goto(`${BASE}/chats`);
  seen.chats = response.status();
  seen.listed = await page.$$eval("#chats tr[data-chat]", (rows) => rows.map((r) => r.dataset.chat));
  await shot("chats");
  await Promise.all([page.waitForNavigation(), page.click(`a[href="/chats/${CHAT}"]`)]);
  await shot("chat");
  await page.select("#form-model select", "big");
  await Promise.all([page.waitForNavigation(), page.click("#form-model button")]);
  seen.done = await page.$eval("#done", (e) => e.textContent);
  seen.model = await page.$eval("#model", (e) => e.textContent);
  await shot("chat-saved");

  // The same form posted again: nothing to change, said so.
  await page.select("#form-model select", "big");
  await Promise.all([page.waitForNavigation(), page.click("#form-model button")]);
  seen.again = await page.$eval("#done", (e) => e.textContent);

  // The jobs page: the chat's reminder cancelled with its button.
  response = await page.goto(`${BASE}/jobs`);
  seen.jobs = await page.$$eval("#jobs tr[data-job]", (rows) => rows.map((r) => r.dataset.job));
  await shot("jobs");
  await Promise.all([page.waitForNavigation(), page.click("#jobs tr[data-job] button")]);
  seen.cancelled = await page.$eval("#done", (e) => e.textContent);
  seen.jobs_after = await page.$$eval("#jobs tr[data-job]", (rows) => rows.length);

  // The approvals page, open in two tabs: the call approved with a double click, then
  // again from the other tab. lull stores one answer and runs the call once.
  const other = await browser.newPage();
  await other.setViewport({ width: 1200, height: 900 });
  await other.goto(`${BASE}/approvals`);
  // A page in the background gets no frames: bring each to the front to use it.
  await page.bringToFront();
  response = await page.goto(`${BASE}/approvals`);
  seen.approvals = await page.$$eval("#approvals tr[data-approval]", (rows) => rows.map((r) => r.dataset.approval));
  await shot("approvals");
  // Two submissions: the browser follows the last one's answer, so wait for the page
  // that says what was done rather than for one navigation.
  await page.click(`#approve-${APPROVAL} button`, { clickCount: 2 });
  await page.waitForSelector("#done", { timeout: 15000 });
  seen.approved = await page.$eval("#done", (e) => e.textContent);
  await shot("approvals-answered");
  await other.bringToFront();
  await Promise.all([other.waitForNavigation(), other.click(`#approve-${APPROVAL} button`)]);
  seen.approved_again = await other.$eval("#done", (e) => e.textContent);
  await other.close();
  await page.bringToFront();

  // The people page: bob denied, then allowed; his message is refused, then stored
  // (the Rust test sees it answered).
  const post = async (id) => {
    const r = await fetch(`${BASE}/api/messages`, {
      method: "POST",
      headers: { Authorization: `Bearer ${TOKEN}`, "Content-Type": "application/json" },
      body: JSON.stringify({ conversation: "c3", user: "bob", text: "hi, it is bob", id }),
    });
    return (await r.json()).status;
  };
  const decide = async (action) => {
    await page.type(`.form-${action} input[name=user]`, "http:bob");
    await Promise.all([page.waitForNavigation(), page.click(`.form-${action} button`)]);
    return page.$eval("#done", (e) => e.textContent);
  };
  response = await page.goto(`${BASE}/people`);
  seen.people = response.status();
  seen.denied = await decide("deny");
  seen.bob_denied = await post("b1");
  seen.allowed = await decide("allow");
  seen.bob_allowed = await post("b2");
  await shot("people");
  response = await page.goto(`${BASE}/memories?scope=person:http:ann`);
  seen.memories = response.status();
  await shot("memories");
  response = await page.goto(`${BASE}/tools`);
  seen.tools = response.status();
  seen.tools_listed = await page.$$eval("#tools tr[data-tool]", (rows) => rows.map((r) => r.dataset.tool));
  await shot("tools");

  // A forged post from the page (no form token): refused, nothing changed.
  seen.forged = await page.evaluate(async (chat) => {
    const r = await fetch(`/chats/${chat}`, {
      method: "POST",
      headers: { "Content-Type": "application/x-www-form-urlencoded" },
      body: "action=model&value=small",
      redirect: "manual",
    });
    return r.status;
  }, CHAT);

  // On a phone: nothing wider than the screen (wide tables scroll inside their box).
  await page.setViewport({ width: 390, height: 844, isMobile: true });
  for (const path of ["/", "/approvals", "/chats"]) {
    await page.goto(`${BASE}${path}`);
    // A phone's browser widens its layout to fit what would not: compare with the screen.
    const wide = await page.evaluate(() => document.documentElement.scrollWidth);
    seen[`phone${path}`] = wide <= 390 ? "fits" : `${wide}px on a 390px screen`;
  }
  await shot("phone");
  await page.setViewport({ width: 1200, height: 900 });

  // Log out: the session ends, and the console asks for the token again.
  await page.goto(`${BASE}/logout`);
  await Promise.all([page.waitForNavigation(), page.click("#logout button")]);
  seen.after_logout = new URL(page.url()).pathname;
  response = await page.goto(`${BASE}/chats`);
  seen.logged_out = response.status();

  // A session past its end (signed with the token, so only its end is wrong): refused.
  await page.setCookie({ name: "lull_status", value: EXPIRED, url: BASE });
  response = await page.goto(`${BASE}/chats`);
  seen.expired = response.status();
} finally {
  await browser.close();
}
console.log(JSON.stringify(seen));
