// specli's page: a chat (or, for a base model, a completion box) over the server's own
// streaming API. Each streamed chunk is a run of tokens from one source; its text goes into the
// page as a text node in a span of that source's colour, never as HTML. The side panel counts
// the chunks' tokens live, and takes the server's `timings` when the answer ends.
"use strict";

const $ = (id) => document.getElementById(id);

const state = {
  key: null, // the API key, when the server asks for one: in this page's memory only
  chat: true, // the target has a chat template: /v1/chat/completions, else /v1/completions
  messages: [], // the conversation so far (chat)
  controller: null, // aborts the answer being streamed; closing the stream cancels it on the server
};

// --- the API ---------------------------------------------------------------------------

function call(path, body, signal) {
  const headers = {};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (state.key !== null) headers["Authorization"] = "Bearer " + state.key;
  return fetch(path, {
    method: body === undefined ? "GET" : "POST",
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
    cache: "no-store",
  });
}

async function errorMessage(response) {
  try {
    const data = await response.json();
    if (data && data.error && data.error.message) return data.error.message;
  } catch (_) {
    // not JSON: the status says what there is to say
  }
  return "the server answered " + response.status;
}

class ServerError extends Error {}

// Server-sent events: `data: {...}` lines, a blank line after each, `data: [DONE]` last.
async function readEvents(response, onData) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice("data: ".length);
        if (data === "[DONE]") return;
        onData(JSON.parse(data));
      }
    }
  }
}

// --- one answer --------------------------------------------------------------------------

// A step writes the draft tokens the target kept, then one token of the target's own: a
// target chunk closes a step.
class Answer {
  constructor(box) {
    this.box = box;
    this.text = "";
    this.tokens = 0;
    this.accepted = 0;
    this.steps = []; // [{draft, target}] tokens per step
    this.open = null;
    this.sent = performance.now();
    this.first = null; // when the first text arrived
    this.last = null;
    this.finish = null;
    this.timings = null;
  }

  add(text, source, proposer, tokens) {
    const now = performance.now();
    if (text) {
      const span = document.createElement("span");
      span.className = source === "draft" ? "draft" : "target";
      if (source === "draft" && proposer) span.title = "drafted by " + ({ ngram: "n-gram lookup", draft: "the draft model", mtp: "the model's own MTP layers", grammar: "the grammar" }[proposer] || proposer);
      span.textContent = text;
      const view = $("conversation");
      const following = view.scrollHeight - view.scrollTop - view.clientHeight < 40; // the reader is at the end
      this.box.append(span);
      if (following) view.scrollTop = view.scrollHeight;
      this.text += text;
      if (this.first === null) this.first = now;
    }
    this.last = now;
    this.tokens += tokens;
    if (source !== "draft" && source !== "target") return;
    this.open = this.open || { draft: 0, target: 0 };
    this.open[source] += tokens;
    if (source === "draft") this.accepted += tokens;
    else this.close();
  }

  close() {
    if (this.open && this.open.draft + this.open.target > 0) this.steps.push(this.open);
    this.open = null;
  }
}

function handleChunk(data, answer) {
  if (data.error) throw new ServerError(data.error.message);
  if (data.timings) answer.timings = data.timings;
  for (const choice of data.choices || []) {
    const text = state.chat ? choice.delta && choice.delta.content : choice.text;
    answer.add(text || "", choice.source, choice.proposer, choice.tokens || 0);
    if (choice.finish_reason) answer.finish = choice.finish_reason;
  }
  showStats(answer);
}

// --- the side panel ------------------------------------------------------------------------

function setStat(name, text) {
  $("stat-" + name).textContent = text;
}

function showStats(answer) {
  const t = answer.timings;
  const generating = answer.first !== null && answer.last > answer.first;
  let speed = "–";
  if (t && t.predicted_ms > 0) speed = t.predicted_per_second.toFixed(1);
  else if (generating && answer.tokens > 1) speed = ((answer.tokens - 1) / ((answer.last - answer.first) / 1000)).toFixed(1);
  setStat("speed", speed);
  setStat("first", answer.first === null ? "–" : Math.round(answer.first - answer.sent) + " ms");
  setStat("tokens", String(t ? t.predicted_n : answer.tokens));
  const accepted = t ? t.draft_n_accepted : answer.accepted;
  setStat("accepted", String(accepted));
  setStat("drafted", t ? String(t.draft_n) : "…");
  setStat("rate", t && t.draft_n > 0 ? Math.round((100 * t.draft_n_accepted) / t.draft_n) + "%" : "–");
  const steps = answer.steps.length + (answer.open ? 1 : 0);
  setStat("steps", steps ? steps + " (" + (answer.tokens / steps).toFixed(1) + " per step)" : "–");
  setStat("finish", answer.finish || (answer.timings ? "–" : "…"));
  drawChart(answer.steps.concat(answer.open ? [answer.open] : []));
}

function clearStats() {
  for (const name of ["speed", "first", "tokens", "drafted", "accepted", "rate", "steps", "finish"]) setStat(name, "–");
  drawChart([]);
}

// One bar per step, its target token at the foot and the draft tokens kept above it; the
// latest steps that fit.
function drawChart(steps) {
  const canvas = $("chart");
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 260;
  const height = canvas.clientHeight || 80;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  const context = canvas.getContext("2d");
  context.setTransform(ratio, 0, 0, ratio, 0, 0);
  context.clearRect(0, 0, width, height);
  const style = getComputedStyle(document.documentElement);
  const bar = Math.max(2, Math.min(12, width / Math.max(steps.length, 1)));
  const shown = steps.slice(-Math.floor(width / bar));
  const most = Math.max(1, ...shown.map((step) => step.draft + step.target));
  const unit = (height - 2) / most;
  shown.forEach((step, i) => {
    const x = i * bar;
    const w = Math.max(1, bar - 1);
    context.fillStyle = style.getPropertyValue("--target").trim();
    context.fillRect(x, height - step.target * unit, w, step.target * unit);
    context.fillStyle = style.getPropertyValue("--draft").trim();
    context.fillRect(x, height - (step.target + step.draft) * unit, w, step.draft * unit);
  });
  const longest = steps.reduce((most, step) => Math.max(most, step.draft + step.target), 0);
  canvas.setAttribute("aria-label", steps.length
    ? "tokens written per step: " + steps.length + " steps, at most " + longest + " tokens in one"
    : "tokens written per step");
}

// --- the page ------------------------------------------------------------------------------

function showError(text) {
  $("error").textContent = text;
}

function message(kind, label) {
  const box = document.createElement("div");
  box.className = "message " + kind;
  const role = document.createElement("span");
  role.className = "role";
  role.textContent = label;
  box.append(role);
  $("conversation").append(box);
  return box;
}

function note(box, text) {
  const line = document.createElement("span");
  line.className = "note";
  line.textContent = text;
  box.append(line);
}

function busy(running) {
  $("send").disabled = running;
  $("stop").disabled = !running;
  $("clear").disabled = running;
}

function settings() {
  for (const id of ["draft-tokens", "temperature", "max-tokens"]) {
    const input = $(id);
    if (!input.checkValidity()) throw new ServerError($(id).labels[0].textContent + ": " + input.validationMessage);
  }
  const body = { model: "specli", stream: true, stream_options: { include_usage: true } };
  body.max_tokens = Number($("max-tokens").value);
  body.draft = $("draft").value;
  const draftTokens = $("draft-tokens").value.trim();
  if (body.draft !== "none") body.draft_tokens = draftTokens === "auto" ? "auto" : Number(draftTokens);
  const temperature = $("temperature").value.trim();
  if (temperature !== "") body.temperature = Number(temperature);
  return body;
}

async function send(event) {
  event.preventDefault();
  if (state.controller !== null) return;
  const text = $("prompt").value;
  if (!text.trim()) return;
  let body;
  try {
    body = settings();
  } catch (error) {
    showError(error.message);
    return;
  }
  showError("");
  clearStats();
  let asked = null;
  let box;
  if (state.chat) {
    body.messages = state.messages.concat([{ role: "user", content: text }]);
    asked = message("user", "you");
    asked.append(document.createTextNode(text));
    box = message("assistant", "assistant");
    $("prompt").value = "";
  } else {
    body.prompt = text;
    box = message("assistant", "completion");
    const prompt = document.createElement("span");
    prompt.className = "prompt";
    prompt.textContent = text;
    box.append(prompt);
  }
  const answer = new Answer(box);
  state.controller = new AbortController();
  busy(true);
  try {
    const response = await call(state.chat ? "v1/chat/completions" : "v1/completions", body, state.controller.signal);
    if (response.status === 401) {
      state.key = null;
      askKey("the server refused the key");
      throw new ServerError("");
    }
    if (!response.ok) throw new ServerError(await errorMessage(response));
    await readEvents(response, (data) => handleChunk(data, answer));
  } catch (error) {
    if (error.name === "AbortError") answer.finish = "stopped";
    else if (error.message) showError(error.message);
    else answer.finish = answer.finish || "refused";
  } finally {
    answer.close();
    showStats(answer);
    if (answer.tokens === 0 && answer.finish !== "stopped") {
      box.remove(); // nothing was written: the request failed
      if (asked !== null) asked.remove();
      if (state.chat) $("prompt").value = text;
    } else {
      if (answer.finish === "stopped") note(box, "stopped");
      if (state.chat) state.messages.push({ role: "user", content: text }, { role: "assistant", content: answer.text });
    }
    state.controller = null;
    busy(false);
  }
}

function askKey(why) {
  $("key").hidden = false;
  $("compose").hidden = true;
  showError(why || "");
  $("key-input").focus();
}

async function connect() {
  let response;
  try {
    response = await call("v1/models");
  } catch (error) {
    showError("cannot reach the server: " + error.message);
    return;
  }
  if (response.status === 401) {
    askKey(state.key === null ? "" : "the server refused that key");
    state.key = null;
    return;
  }
  if (!response.ok) {
    showError(await errorMessage(response));
    return;
  }
  setup((await response.json()).data[0]);
}

function setup(card) {
  $("key").hidden = true;
  $("compose").hidden = false;
  showError("");
  state.chat = card.chat !== false;
  $("model").textContent = card.id + (card.draft ? " · draft: " + card.draft : "");
  const select = $("draft");
  select.replaceChildren();
  for (const kind of card.drafts || ["ngram", "none"]) {
    const option = document.createElement("option");
    option.value = kind;
    option.textContent = kind;
    select.append(option);
  }
  $("prompt-label").textContent = state.chat ? "Message" : "Text to continue (a base model, without a chat template)";
  $("clear").textContent = state.chat ? "New chat" : "Clear";
  $("prompt").focus();
}

function start() {
  $("compose").addEventListener("submit", send);
  $("stop").addEventListener("click", () => {
    if (state.controller !== null) state.controller.abort();
  });
  $("clear").addEventListener("click", () => {
    state.messages = [];
    $("conversation").replaceChildren();
    clearStats();
    showError("");
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("compose").requestSubmit();
  });
  $("key").addEventListener("submit", (event) => {
    event.preventDefault();
    state.key = $("key-input").value;
    $("key-input").value = "";
    connect();
  });
  clearStats();
  connect();
}

start();
