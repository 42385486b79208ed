// Markdown for a chat's answers, built as elements: the model's text never becomes HTML.
//
// `Markdown.blocks(text)` splits an answer into top-level blocks, each with a `key` that names
// its kind and the range of the text it covers; `Markdown.element(block, text, write)` builds
// one. Every character shown goes through `write(parent, start, end)`, which appends the
// answer's range [start, end) (as spans that keep who wrote it); the markup's own characters
// (fences, `**`, `#`, list markers, table pipes) are not shown. A block's element depends on
// its own range only, so a block whose key is unchanged need not be built again.
//
// The subset: fenced code, ATX headings, rules, block quotes, lists (nested by indent),
// GitHub tables, paragraphs; inline code, strong, emphasis, strikethrough and backslash
// escapes. Links and HTML stay as the characters they are.
"use strict";

const Markdown = (() => {
  const FENCE = /^( {0,3})(`{3,}|~{3,})(.*)$/;
  const HEADING = /^ {0,3}(#{1,6})(?=[ \t]|$)/;
  const RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
  const QUOTE = /^ {0,3}> ?/;
  const ITEM = /^( {0,3})([-*+]|\d{1,9}[.)])(?=[ \t]|$)[ \t]*/;
  const NESTED_ITEM = /^[ \t]*([-*+]|\d{1,9}[.)])(?=[ \t]|$)/;
  const DELIMITER_ROW = /^ {0,3}\|?[ \t]*:?-+:?[ \t]*(\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$/;
  const PUNCTUATION = /[!-/:-@[-`{-~]/;

  // --- lines and views ----------------------------------------------------------------------

  // A line is a range {start, end} of the answer, without its newline; a quote's `>` or a list
  // item's marker and indent may be left out of its start.
  function linesOf(text) {
    const lines = [];
    let start = 0;
    for (;;) {
      const end = text.indexOf("\n", start);
      if (end < 0) break;
      lines.push({ start, end });
      start = end + 1;
    }
    lines.push({ start, end: text.length });
    return lines;
  }

  const source = (text, line) => text.slice(line.start, line.end);
  const blank = (text, line) => source(text, line).trim() === "";
  const strip = (line, count) => ({ start: Math.min(line.start + count, line.end), end: line.end });

  // Some lines as one string (the newline between two lines is the answer's own), and where in
  // the answer each of its characters is.
  class View {
    constructor(text, lines) {
      this.pieces = []; // {at, start, end}: the view's [at, at + end - start) is the answer's [start, end)
      this.string = "";
      lines.forEach((line, i) => {
        const end = i < lines.length - 1 ? line.end + 1 : line.end;
        const last = this.pieces[this.pieces.length - 1];
        if (last && last.end === line.start) last.end = end; // nothing left out between them: one piece
        else this.pieces.push({ at: this.string.length, start: line.start, end });
        this.string += text.slice(line.start, end);
      });
    }

    // Appends the view's [a, b) through `write`, piece by piece.
    write(parent, write, a, b) {
      for (const piece of this.pieces) {
        const from = Math.max(a, piece.at);
        const to = Math.min(b, piece.at + piece.end - piece.start);
        if (to > from) write(parent, piece.start + from - piece.at, piece.start + to - piece.at);
      }
    }
  }

  // --- blocks -------------------------------------------------------------------------------

  // The blocks of some lines: [{kind, key, ...}], in order.
  function blocks(text, lines = linesOf(text)) {
    const found = [];
    let i = 0;
    while (i < lines.length) {
      if (blank(text, lines[i])) {
        i += 1;
        continue;
      }
      const block = codeBlock(text, lines, i) || lineBlock(text, lines, i) || quote(text, lines, i) ||
        list(text, lines, i) || table(text, lines, i) || paragraph(text, lines, i);
      block.key = block.kind + ":" + lines[i].start + ":" + lines[block.next - 1].end;
      found.push(block);
      i = block.next;
    }
    return found;
  }

  // A fenced block: to its closing fence, or to the end while the answer is still streaming.
  function codeBlock(text, lines, i) {
    const open = FENCE.exec(source(text, lines[i]));
    if (!open || (open[2][0] === "`" && open[3].includes("`"))) return null;
    const fence = open[2];
    let j = i + 1;
    while (j < lines.length) {
      const close = /^ {0,3}(`{3,}|~{3,})[ \t]*$/.exec(source(text, lines[j]));
      if (close && close[1][0] === fence[0] && close[1].length >= fence.length) break;
      j += 1;
    }
    const indent = open[1].length;
    const body = lines.slice(i + 1, j).map((line) => strip(line, Math.min(indent, leading(source(text, line)))));
    const info = /\S+/.exec(open[3]); // the language: the info string's first word
    const at = lines[i].start + open[1].length + fence.length;
    const language = info ? { start: at + info.index, end: at + info.index + info[0].length } : null;
    return { kind: "code", language, body, next: Math.min(j + 1, lines.length) };
  }

  function leading(string) {
    return string.length - string.trimStart().length;
  }

  // One line: a heading or a rule.
  function lineBlock(text, lines, i) {
    const string = source(text, lines[i]);
    if (RULE.test(string)) return { kind: "rule", next: i + 1 };
    const heading = HEADING.exec(string);
    if (!heading) return null;
    let end = string.trimEnd().length;
    const closing = /[ \t]#+$/.exec(string.slice(0, end));
    if (closing) end = closing.index;
    const start = Math.min(heading[0].length + leading(string.slice(heading[0].length)), end);
    const line = { start: lines[i].start + start, end: lines[i].start + Math.max(start, end) };
    return { kind: "heading", level: heading[1].length, line, next: i + 1 };
  }

  function quote(text, lines, i) {
    const inner = [];
    let j = i;
    for (; j < lines.length && !blank(text, lines[j]); j += 1) {
      const marker = QUOTE.exec(source(text, lines[j]));
      if (!marker && (j === i || startsBlock(text, lines, j))) break;
      inner.push(marker ? strip(lines[j], marker[0].length) : lines[j]);
    }
    return j === i ? null : { kind: "quote", inner, next: j };
  }

  // A list: items of one kind (bullets, or numbers); an item holds the lines indented under it.
  function list(text, lines, i) {
    const first = ITEM.exec(source(text, lines[i]));
    if (!first) return null;
    const ordered = /\d/.test(first[2]);
    const items = [];
    let j = i;
    for (;;) {
      const marker = j < lines.length ? ITEM.exec(source(text, lines[j])) : null;
      if (!marker || /\d/.test(marker[2]) !== ordered) break;
      const item = listItem(text, lines, j, marker);
      items.push(item.lines);
      j = item.next;
    }
    return { kind: "list", ordered, first: ordered ? parseInt(first[2], 10) : 1, items, next: j };
  }

  function listItem(text, lines, i, marker) {
    const indent = marker[1].length;
    const width = source(text, lines[i]).trim() === marker[0].trim() ? indent + marker[2].length + 1 : marker[0].length;
    const held = [strip(lines[i], marker[0].length)];
    let j = i + 1;
    let gap = 0; // blank lines held back: the item's only if an indented line follows them
    for (; j < lines.length; j += 1) {
      const string = source(text, lines[j]);
      const indented = leading(string);
      if (string.trim() === "") {
        gap += 1;
        continue;
      }
      const nested = indented > indent && NESTED_ITEM.test(string);
      const lazy = gap === 0 && !startsBlock(text, lines, j);
      if (indented < width && !nested && !lazy) break;
      for (; gap > 0; gap -= 1) held.push(strip(lines[j - gap], width));
      held.push(strip(lines[j], Math.min(indented, width)));
    }
    return { lines: held, next: j - gap };
  }

  // A table: a header row, a row of dashes, then rows while they hold a pipe.
  function table(text, lines, i) {
    if (!isTableStart(text, lines, i)) return null;
    const align = cells(text, lines[i + 1]).map(({ start, end }) => {
      const cell = text.slice(start, end);
      if (cell.endsWith(":")) return cell.startsWith(":") ? "center" : "right";
      return cell.startsWith(":") ? "left" : "";
    });
    const rows = [cells(text, lines[i])];
    let j = i + 2;
    for (; j < lines.length && source(text, lines[j]).includes("|") && !startsBlock(text, lines, j); j += 1) {
      rows.push(cells(text, lines[j]));
    }
    return { kind: "table", align, rows, next: j };
  }

  function isTableStart(text, lines, i) {
    return i + 1 < lines.length && source(text, lines[i]).includes("|") && DELIMITER_ROW.test(source(text, lines[i + 1]));
  }

  // A row's cells, each a range of the answer without its pipes and outer spaces; a pipe in
  // code or after a backslash is text.
  function cells(text, line) {
    const found = [];
    let start = line.start;
    let code = false;
    for (let k = line.start; k <= line.end; k += 1) {
      const c = k < line.end ? text[k] : "|";
      if (c === "\\") k += 1;
      else if (c === "`") code = !code;
      else if (c === "|" && (!code || k === line.end)) {
        found.push(trimmed(text, start, k));
        start = k + 1;
      }
    }
    if (found.length > 1 && found[0].end === found[0].start) found.shift(); // a leading pipe
    const last = found[found.length - 1];
    if (found.length > 1 && last.end === last.start && text.slice(line.start, line.end).trimEnd().endsWith("|")) found.pop();
    return found;
  }

  function trimmed(text, start, end) {
    while (start < end && /\s/.test(text[start])) start += 1;
    while (end > start && /\s/.test(text[end - 1])) end -= 1;
    return { start, end };
  }

  function startsBlock(text, lines, j) {
    const string = source(text, lines[j]);
    return FENCE.test(string) || HEADING.test(string) || RULE.test(string) || QUOTE.test(string) ||
      ITEM.test(string) || isTableStart(text, lines, j);
  }

  function paragraph(text, lines, i) {
    let j = i + 1;
    while (j < lines.length && !blank(text, lines[j]) && !startsBlock(text, lines, j)) j += 1;
    return { kind: "paragraph", lines: lines.slice(i, j), next: j };
  }

  // --- elements -----------------------------------------------------------------------------

  function make(tag, className) {
    const element = document.createElement(tag);
    if (className) element.className = className;
    return element;
  }

  function element(block, text, write) {
    switch (block.kind) {
      case "code":
        return codeElement(block, text, write);
      case "heading": {
        const heading = make("h" + Math.min(block.level + 2, 6), "md-h" + block.level);
        inline(heading, new View(text, [block.line]), write);
        return heading;
      }
      case "rule":
        return make("hr");
      case "quote":
        return container(make("blockquote"), blocks(text, block.inner), text, write);
      case "list":
        return listElement(block, text, write);
      case "table":
        return tableElement(block, text, write);
      default: {
        const paragraph = make("p");
        inline(paragraph, new View(text, block.lines), write);
        return paragraph;
      }
    }
  }

  // The block's code, and above it the language its fence names (the model wrote that too).
  function codeElement(block, text, write) {
    const wrap = make("div", "code");
    if (block.language) {
      const language = make("div", "language");
      write(language, block.language.start, block.language.end);
      wrap.append(language);
    }
    const pre = make("pre");
    const code = make("code");
    if (block.language) code.dataset.language = text.slice(block.language.start, block.language.end);
    const view = new View(text, block.body);
    view.write(code, write, 0, view.string.length);
    pre.append(code);
    wrap.append(pre);
    return wrap;
  }

  function container(parent, children, text, write) {
    for (const child of children) parent.append(element(child, text, write));
    return parent;
  }

  function listElement(block, text, write) {
    const list = make(block.ordered ? "ol" : "ul");
    if (block.ordered && block.first !== 1) list.start = block.first;
    for (const lines of block.items) list.append(container(make("li"), blocks(text, lines), text, write));
    return list;
  }

  function tableElement(block, text, write) {
    const wrap = make("div", "table");
    const table = make("table");
    const head = make("thead");
    const body = make("tbody");
    block.rows.forEach((row, r) => {
      const tr = make("tr");
      block.align.forEach((align, c) => {
        const cell = make(r === 0 ? "th" : "td");
        if (align) cell.className = "align-" + align;
        if (c < row.length) inline(cell, new View(text, [row[c]]), write);
        tr.append(cell);
      });
      (r === 0 ? head : body).append(tr);
    });
    table.append(head, body);
    wrap.append(table);
    return wrap;
  }

  // --- inline -------------------------------------------------------------------------------

  // The view's [a, b) into `parent`: code spans, strong, emphasis and strikethrough as elements,
  // everything else as text.
  function inline(parent, view, write, a = 0, b = view.string.length) {
    const s = view.string;
    let plain = a; // where the text not yet written starts
    let i = a;
    const flush = (end) => {
      if (end > plain) view.write(parent, write, plain, end);
    };
    while (i < b) {
      const c = s[i];
      let found = null;
      if (c === "\\" && i + 1 < b && PUNCTUATION.test(s[i + 1])) found = { tags: [], from: i + 1, to: i + 2, end: i + 2 };
      else if (c === "`") found = codeSpan(s, i, b);
      else if (c === "*" || c === "_" || c === "~") found = emphasis(s, i, a, b);
      if (found === null) {
        i += c === "`" || c === "*" || c === "_" || c === "~" ? run(s, i, b) : 1;
        continue;
      }
      flush(i);
      if (found.tags.length === 0) view.write(parent, write, found.from, found.to);
      else parent.append(nested(found, view, write));
      plain = i = found.end;
    }
    flush(b);
  }

  function nested(found, view, write) {
    const outer = make(found.tags[0]);
    let inner = outer;
    for (const tag of found.tags.slice(1)) inner = inner.appendChild(make(tag));
    if (found.tags[0] === "code") view.write(inner, write, found.from, found.to);
    else inline(inner, view, write, found.from, found.to);
    return outer;
  }

  function run(s, i, b) {
    let j = i;
    while (j < b && s[j] === s[i]) j += 1;
    return j - i;
  }

  // `code`: to the next run of exactly as many backticks; one space each side is padding.
  function codeSpan(s, i, b) {
    const n = run(s, i, b);
    for (let j = i + n; j < b; ) {
      const m = s[j] === "`" ? run(s, j, b) : 0;
      if (m === n) {
        let from = i + n;
        let to = j;
        if (to - from > 2 && s[from] === " " && s[to - 1] === " " && s.slice(from, to).trim()) {
          from += 1;
          to -= 1;
        }
        return { tags: ["code"], from, to, end: j + n };
      }
      j += Math.max(m, 1);
    }
    return null;
  }

  // *em*, **strong**, ***both***, the same with _ (not inside a word), and ~~struck~~: a run that
  // opens before a non-space, closed by as long a run after a non-space.
  function emphasis(s, i, a, b) {
    const c = s[i];
    const n = run(s, i, b);
    const length = c === "~" ? 2 : Math.min(n, 3);
    if ((c === "~" && n !== 2) || i + n >= b || /\s/.test(s[i + n])) return null;
    if (c === "_" && i > a && /[\p{L}\p{N}]/u.test(s[i - 1])) return null;
    for (let j = i + n; j < b; ) {
      if (s[j] === "`") {
        const code = codeSpan(s, j, b);
        j = code ? code.end : j + run(s, j, b);
        continue;
      }
      const m = s[j] === c ? run(s, j, b) : 0;
      const closes = m === length && !/\s/.test(s[j - 1]) && !(c === "_" && j + m < b && /[\p{L}\p{N}]/u.test(s[j + m]));
      if (closes) {
        const tags = c === "~" ? ["del"] : [["em"], ["strong"], ["strong", "em"]][length - 1];
        return { tags, from: i + n, to: j, end: j + m };
      }
      j += Math.max(m, 1);
    }
    return null;
  }

  return { blocks: (text) => blocks(text), element };
})();
