// specli's page: a chat (or, for a base model, a completion box) over the server's own
// streaming API. Each streamed chunk is a run of tokens from one source; its text goes into the
// page as text nodes in spans of that source's colour, never as HTML. A chat's answer is shown
// as Markdown (markdown.js), a completion's verbatim (it continues text the page did not
// parse). The side panel counts the chunks' tokens live, and takes the server's `timings` when
// the answer ends. The conversation follows the answer while the reader stays at its end.
"use strict";

const $ = (id) => document.getElementById(id);

const state = {
  key: null, // the API key, when the server asks for one: in this page's memory only
  chat: true, // the target has a chat template: /v1/chat/completions, else /v1/completions
  messages: [], // the conversation so far (chat), without the system prompt
  controller: null, // aborts the answer being streamed; closing the stream cancels it on the server
  draftModel: "model", // what the `model` draft is called: the draft model's file, where the server names it
  proposers: {}, // who drafted a span, by its proposer name, in words: /v1/models says
  follow: true, // the conversation keeps its end in view: false once the reader scrolls up
  vision: false, // the model takes images (/v1/models' capabilities: "multimodal")
  images: [], // data: URLs of the images attached to the next message
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

// The server went away: before answering (cannot be reached), or during an answer.
class ServerLost extends Error {}
const LOST_MID_ANSWER = "lost the server mid-answer: the connection closed before the answer's end";
const UNREACHABLE = "cannot reach the server: is specli serve still running?";

// Server-sent events: `data: {...}` lines, a blank line after each, `data: [DONE]` last. A stream
// that ends or breaks before [DONE] is a lost server.
async function readEvents(response, onData) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    let chunk;
    try {
      chunk = await reader.read();
    } catch (error) {
      if (error.name === "AbortError") throw error;
      chunk = { done: true }; // the connection broke
    }
    if (chunk.done) throw new ServerLost(LOST_MID_ANSWER);
    buffer += decoder.decode(chunk.value, { stream: true });
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

// One answer as it streams: its text, who wrote each run of it, and the counts the panel shows.
// A step writes the draft tokens the target kept, then one token of the target's own: a
// target chunk closes a step. The text goes into the page once a frame (and at the end).

class Answer {
  constructor(box, markdown) {
    this.box = box;
    this.markdown = markdown; // a chat's answer: Markdown; a completion: verbatim
    this.body = document.createElement(markdown ? "div" : "span");
    this.body.className = markdown ? "body markdown" : "body";
    box.append(this.body);
    this.text = "";
    this.runs = []; // {start, end, source, proposer}: the text's [start, end) written by one source
    this.shown = 0; // verbatim: the text in the page so far
    this.blocks = []; // Markdown: [{key, element}], the blocks in the page so far
    this.frame = null;
    this.tokens = 0;
    this.accepted = 0;
    this.drafted = 0; // draft tokens verified, kept or not (the chunks' `drafted`)
    this.kept = 0; // of those, kept (drafted tokens but the grammar's forced ones)
    this.steps = []; // [{draft, target}] tokens per step
    this.open = null;
    this.sent = performance.now();
    this.first = null; // when the first text arrived
    this.last = null;
    this.finish = null;
    this.timings = null;
    this.ended = false;
  }

  add(text, source, proposer, tokens, drafted) {
    const now = performance.now();
    if (text) {
      this.runs.push({ start: this.text.length, end: this.text.length + text.length, source, proposer });
      this.text += text;
      if (this.first === null) this.first = now;
    }
    this.last = now;
    this.tokens += tokens;
    this.drafted += drafted;
    if (source === "draft" || source === "target") {
      this.open = this.open || { draft: 0, target: 0 };
      this.open[source] += tokens;
      if (source === "draft") {
        this.accepted += tokens;
        if (proposer !== "grammar") this.kept += tokens;
      } else this.close();
    }
    if (this.frame === null) this.frame = requestAnimationFrame(() => this.show());
  }

  close() {
    if (this.open && this.open.draft + this.open.target > 0) this.steps.push(this.open);
    this.open = null;
  }

  end() {
    this.close();
    this.ended = true;
    this.show();
  }

  // Puts what arrived into the page, with the panel, and keeps the end in view if followed.
  show() {
    if (this.frame !== null) cancelAnimationFrame(this.frame);
    this.frame = null;
    if (this.markdown) this.showBlocks();
    else if (this.shown < this.text.length) {
      this.write(this.body, this.shown, this.text.length);
      this.shown = this.text.length;
    }
    showStats(this);
    keepEndInView();
  }

  // The blocks whose key is unchanged stay as they are; the rest are built again.
  showBlocks() {
    const blocks = Markdown.blocks(this.text);
    let kept = 0;
    while (kept < blocks.length && kept < this.blocks.length && blocks[kept].key === this.blocks[kept].key) kept += 1;
    for (const old of this.blocks.splice(kept)) old.element.remove();
    for (const block of blocks.slice(kept)) {
      const element = Markdown.element(block, this.text, (parent, start, end) => this.write(parent, start, end));
      this.body.append(element);
      this.blocks.push({ key: block.key, element });
    }
  }

  // The text's [start, end) into `parent`: one span per run of one source, as text.
  write(parent, start, end) {
    let low = 0;
    let high = this.runs.length;
    while (low < high) {
      const middle = (low + high) >> 1;
      if (this.runs[middle].end <= start) low = middle + 1;
      else high = middle;
    }
    for (let i = low; i < this.runs.length && this.runs[i].start < end; i += 1) {
      const run = this.runs[i];
      const span = document.createElement("span");
      span.className = run.source === "draft" ? "draft" : "target";
      if (run.source === "draft" && run.proposer) span.title = "drafted by " + (state.proposers[run.proposer] || run.proposer);
      span.textContent = this.text.slice(Math.max(start, run.start), Math.min(end, run.end));
      parent.append(span);
    }
  }
}

function handleChunk(data, answer) {
  if (data.error) throw new ServerError(data.error.message);
  if (data.timings) answer.timings = data.timings;
  for (const choice of data.choices || []) {
    const text = state.chat ? choice.delta && choice.delta.content : choice.text;
    answer.add(text || "", choice.source, choice.proposer, choice.tokens || 0, choice.drafted || 0);
    if (choice.finish_reason) answer.finish = choice.finish_reason;
  }
}

// --- following the answer --------------------------------------------------------------------

function atEnd(view) {
  return view.scrollHeight - view.scrollTop - view.clientHeight < 24;
}

function keepEndInView() {
  const view = $("conversation");
  if (state.follow) view.scrollTop = view.scrollHeight;
}

// --- the side panel ------------------------------------------------------------------------

function setStat(name, text) {
  $("stat-" + name).textContent = text;
}

// Live from the chunks: speed, first token, tokens, accepted, the draft's share, the steps, and
// what was drafted (kept or not) where the chunks say (`drafted`); the server's `timings` give
// the final figures. Before any draft, "…"; after an end without timings (stopped, lost), "–".
function showStats(answer) {
  const t = answer.timings;
  const pending = answer.ended ? "–" : "…";
  const generating = answer.first !== null && answer.last > answer.first;
  let speed = "–";
  if (t && t.predicted_ms > 0) speed = t.predicted_per_second.toFixed(1);
  else if (generating && answer.tokens > 1) speed = ((answer.tokens - 1) / ((answer.last - answer.first) / 1000)).toFixed(1);
  setStat("speed", speed);
  setStat("first", answer.first === null ? "–" : Math.round(answer.first - answer.sent) + " ms");
  const tokens = t ? t.predicted_n : answer.tokens;
  const accepted = t ? t.draft_n_accepted : answer.accepted;
  setStat("tokens", String(tokens));
  setStat("accepted", String(accepted));
  setStat("share", tokens > 0 ? Math.round((100 * accepted) / tokens) + "%" : "–");
  const drafted = t ? t.draft_n : answer.drafted;
  const kept = t ? t.draft_n_accepted : answer.kept;
  const known = t || answer.drafted > 0;
  setStat("drafted", known ? String(drafted) : pending);
  setStat("rate", known ? (drafted > 0 ? Math.round((100 * kept) / drafted) + "%" : "–") : pending);
  showSteps(answer.steps.length + (answer.open ? 1 : 0), answer.tokens);
  setStat("finish", answer.finish || pending);
  drawChart(answer.steps.concat(answer.open ? [answer.open] : []));
}

// The steps, and the tokens each wrote on average (left out where the panel is narrow).
function showSteps(steps, tokens) {
  const cell = $("stat-steps");
  if (!steps) {
    cell.textContent = "–";
    return;
  }
  const each = document.createElement("span");
  each.className = "per-step";
  each.textContent = " (" + (tokens / steps).toFixed(1) + " per step)";
  cell.replaceChildren(String(steps), each);
}

function clearStats() {
  for (const name of ["speed", "first", "tokens", "accepted", "share", "drafted", "rate", "steps", "finish"]) {
    setStat(name, "–");
  }
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

// The request's fields from the settings; throws naming a field that is not valid.
function settings() {
  for (const id of ["draft-tokens", "temperature", "seed", "max-tokens"]) {
    const input = $(id);
    if (!input.checkValidity()) throw new ServerError(input.labels[0].textContent + ": " + input.validationMessage);
  }
  const body = { model: "specli", stream: true, stream_options: { include_usage: true } };
  body.max_tokens = Number($("max-tokens").value);
  body.draft = $("draft").value;
  if (body.draft !== "none") body.draft_tokens = draftTokens() === "auto" ? "auto" : Number(draftTokens());
  const temperature = $("temperature").value.trim();
  if (temperature !== "") body.temperature = Number(temperature);
  const seed = $("seed").value.trim();
  if (seed !== "") body.seed = Number(seed);
  return body;
}

function draftTokens() {
  return $("draft-tokens").value.trim() || "auto";
}

// The turn in the conversation: the reader's message (a chat) or the prompt (a completion),
// and the box the answer streams into; the body gets the messages or the prompt.
function newTurn(text, body) {
  if (!state.chat) {
    body.prompt = text;
    const box = message("assistant", "completion");
    const prompt = document.createElement("span");
    prompt.className = "prompt";
    prompt.textContent = text;
    box.append(prompt);
    return { asked: null, box };
  }
  const system = $("system").value;
  const images = state.images;
  const content = images.length
    ? images.map((url) => ({ type: "image_url", image_url: { url } })).concat([{ type: "text", text }])
    : text;
  body.messages = (system.trim() ? [{ role: "system", content: system }] : [])
    .concat(state.messages, [{ role: "user", content }]);
  const asked = message("user", "you");
  for (const url of images) asked.append(picture(url));
  asked.append(document.createTextNode(text));
  $("prompt").value = "";
  attach([]);
  return { asked, box: message("assistant", "assistant"), content, images };
}

function picture(url) {
  const image = document.createElement("img");
  image.src = url;
  image.alt = "an attached image";
  return image;
}

// The images for the next message, shown under the message box (each with a button that takes it off).
function attach(urls) {
  state.images = urls;
  const list = $("attached");
  list.replaceChildren();
  list.hidden = urls.length === 0;
  urls.forEach((url, index) => {
    const item = document.createElement("span");
    item.className = "attachment";
    const remove = document.createElement("button");
    remove.type = "button";
    remove.textContent = "×";
    remove.title = "take this image off";
    remove.addEventListener("click", () => attach(state.images.filter((_, i) => i !== index)));
    item.append(picture(url), remove);
    list.append(item);
  });
}

// Files chosen or dropped: each image read as a data: URL (the server fetches nothing).
function addImages(files) {
  const images = [...files].filter((file) => file.type.startsWith("image/"));
  if (!state.vision || !state.chat) {
    if (images.length) showError("this model takes no images (start the server with --mmproj FILE)");
    return;
  }
  for (const file of images) {
    const reader = new FileReader();
    reader.onload = () => attach(state.images.concat([reader.result]));
    reader.onerror = () => showError("could not read " + file.name);
    reader.readAsDataURL(file);
  }
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
  const turn = newTurn(text, body);
  const answer = new Answer(turn.box, state.chat);
  state.follow = true; // a new turn is what the reader wants to see
  keepEndInView();
  state.controller = new AbortController();
  busy(true);
  try {
    await stream(answer, body);
  } catch (error) {
    if (error.name === "AbortError") answer.finish = "stopped";
    else if (error instanceof ServerLost) answer.finish = answer.tokens > 0 ? "lost" : null;
    else if (error.message) answer.finish = answer.finish || "error";
    else answer.finish = answer.finish || "refused";
    if (error.name !== "AbortError" && error.message) showError(error.message);
  } finally {
    answer.end();
    settle(answer, turn, text);
    state.controller = null;
    busy(false);
  }
}

async function stream(answer, body) {
  let response;
  try {
    response = await call(state.chat ? "v1/chat/completions" : "v1/completions", body, state.controller.signal);
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ServerLost(UNREACHABLE);
  }
  if (response.status === 401) {
    state.key = null;
    askKey("the server refused the key");
    throw new ServerError("");
  }
  if (!response.ok) throw new ServerError(await errorMessage(response));
  await readEvents(response, (data) => handleChunk(data, answer));
}

// After the answer: a turn with nothing written is taken back (the request failed); one cut
// short says so, and a chat keeps what was written in its history.
function settle(answer, turn, text) {
  if (answer.tokens === 0 && answer.finish !== "stopped") {
    turn.box.remove();
    if (turn.asked !== null) turn.asked.remove();
    if (state.chat) $("prompt").value = text;
    if (turn.images && turn.images.length) attach(turn.images); // still there for the next send
    clearStats(); // nothing was written: no counts of nothing beside the dashes
    if (answer.finish) setStat("finish", answer.finish);
    return;
  }
  if (answer.finish === "stopped") note(turn.box, "stopped");
  if (answer.finish === "lost") note(turn.box, "the server was lost here");
  if (answer.finish === "length") note(turn.box, "cut at the token limit (Settings: Token limit)");
  if (state.chat) state.messages.push({ role: "user", content: turn.content }, { role: "assistant", content: answer.text });
  keepEndInView();
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
    showError(UNREACHABLE);
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
  state.vision = (card.capabilities || []).includes("multimodal");
  $("attach").hidden = !(state.vision && state.chat);
  const drafts = card.drafts || ["ngram", "none"];
  state.proposers = card.proposers || {};
  state.draftModel = card.draft && !drafts.includes(card.draft) ? card.draft : "model";
  $("model").textContent = card.id;
  const select = $("draft");
  select.replaceChildren();
  for (const kind of drafts) {
    const option = document.createElement("option");
    option.value = kind;
    option.textContent = kind === "model" && state.draftModel !== "model" ? "model (" + state.draftModel + ")" : kind;
    select.append(option);
  }
  showDrafting();
  $("prompt-label").textContent = state.chat ? "Message" : "Text to continue (a base model, without a chat template)";
  $("hint").textContent = state.chat ? "Enter sends, Shift+Enter adds a line" : "Ctrl+Enter sends";
  $("clear").textContent = state.chat ? "New chat" : "Clear";
  $("system-field").hidden = !state.chat;
  $("prompt").focus();
}

// The header says how the next answer will be drafted, as the settings now say.
function showDrafting() {
  const kind = $("draft").value;
  $("draft-tokens").disabled = kind === "none";
  const who = kind === "model" ? state.draftModel : kind;
  $("drafting").textContent = "draft: " + who + (kind === "none" ? "" : " · draft tokens: " + draftTokens());
}

// Enter sends in a chat (Shift+Enter adds a line); a completion's text often spans lines, so
// there Enter adds a line. Ctrl+Enter (Cmd+Enter) sends in both.
function onPromptKey(event) {
  if (event.key !== "Enter" || event.isComposing) return;
  const sends = event.ctrlKey || event.metaKey || (state.chat && !event.shiftKey && !event.altKey);
  if (!sends) return;
  event.preventDefault();
  $("compose").requestSubmit();
}

function start() {
  $("compose").addEventListener("submit", send);
  $("stop").addEventListener("click", () => {
    if (state.controller !== null) state.controller.abort();
  });
  $("clear").addEventListener("click", () => {
    state.messages = [];
    attach([]);
    $("conversation").replaceChildren();
    clearStats();
    showError("");
  });
  $("prompt").addEventListener("keydown", onPromptKey);
  $("attach").addEventListener("click", () => $("image").click());
  $("image").addEventListener("change", () => {
    addImages($("image").files);
    $("image").value = "";
  });
  $("compose").addEventListener("dragover", (event) => event.preventDefault());
  $("compose").addEventListener("drop", (event) => {
    event.preventDefault();
    addImages(event.dataTransfer.files);
  });
  $("draft").addEventListener("change", showDrafting);
  $("draft-tokens").addEventListener("input", showDrafting);
  const view = $("conversation");
  view.addEventListener("scroll", () => {
    state.follow = atEnd(view);
  }, { passive: true });
  view.addEventListener("wheel", (event) => {
    if (event.deltaY < 0 && view.scrollTop > 0) state.follow = false; // scrolling up: at once, before the scroll lands
  }, { passive: true });
  $("key").addEventListener("submit", (event) => {
    event.preventDefault();
    state.key = $("key-input").value;
    $("key-input").value = "";
    connect();
  });
  if (window.matchMedia("(max-width: 720px)").matches) $("settings").open = false; // the conversation first
  clearStats();
  connect();
}

start();
