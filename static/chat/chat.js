// The example site's chat page: a conversation with the demo agent over the REST API
// (POST /runs with "conversation": true, POST /runs/{id}/messages, answers to
// questions) and the run's event stream (GET /runs/{id}/events/stream): its events,
// and with AAA["STREAM_TOKENS"] each reply's text as it is written (event: token).
// The stream is the one source of truth: the page shows what the log says, once each.
(function () {
  "use strict";
  var root = document.getElementById("chat");
  if (!root) { return; }
  var api = root.dataset.api;
  var start = JSON.parse(document.getElementById("chat-start").textContent);
  var log = document.getElementById("chat-log");
  var form = document.getElementById("chat-form");
  var input = document.getElementById("chat-input");
  var send = document.getElementById("chat-send");
  var statusBox = document.getElementById("chat-status");
  var runBox = document.getElementById("chat-run");
  var closeButton = document.getElementById("chat-close");
  var questionsBox = document.getElementById("chat-questions");
  var errorBox = document.getElementById("chat-error");

  var runId = root.dataset.run || null;
  var source = null;
  var lastSeq = 0;
  var awaitingMessage = false;   // the run waits for the person's next message
  var repliedTurn = 0;           // the turn of the latest reply the stream showed
  var sentTurn = 0;              // the turn of the latest message this page sent
  var questions = {};            // open questions: id -> their form
  var live = {};                 // request id -> {el, tokens}: replies being written

  function csrf() {
    var m = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    return m ? decodeURIComponent(m[1]) : "";
  }

  function call(method, path, body, headers) {
    var h = {"Content-Type": "application/json", "X-CSRFToken": csrf()};
    Object.keys(headers || {}).forEach(function (k) { h[k] = headers[k]; });
    return fetch(api + path, {method: method, headers: h, credentials: "same-origin",
                              body: body === undefined ? undefined : JSON.stringify(body)})
      .then(function (r) {
        return r.text().then(function (t) { return {status: r.status, body: t ? JSON.parse(t) : null}; });
      });
  }

  function problem(res) {
    var items = (res.body && res.body.detail) || [];
    return items.map(function (d) { return (d.loc || []).join(".") + ": " + d.msg; }).join("; ") ||
      "HTTP " + res.status;
  }

  function showError(text) {
    errorBox.textContent = text || "";
    errorBox.hidden = !text;
  }

  function setStatus(status) {
    statusBox.textContent = status;
    statusBox.dataset.status = status;
    root.dataset.status = status;
    var open = status !== "ended";
    send.disabled = !open || (runId !== null && !(awaitingMessage && repliedTurn >= sentTurn));
    input.disabled = !open;
    closeButton.hidden = !(runId && status === "waiting");
  }

  // A reply being written is the newest thing of the run: what the log says comes
  // before it (a reply's first tokens may come before the event of the message it
  // answers: the stream sends the tokens in hand first).
  function bubble(role, text, extra) {
    var li = document.createElement("li");
    li.className = "chat-msg chat-" + role;
    li.textContent = text;
    Object.keys(extra || {}).forEach(function (k) { li.dataset[k] = extra[k]; });
    log.insertBefore(li, (extra && extra.live) ? null : log.querySelector("li.chat-live"));
    li.scrollIntoView({block: "end"});
    return li;
  }

  // -- the event stream -------------------------------------------------------------

  function follow(id) {
    runId = id;
    runBox.textContent = "run " + id;
    root.dataset.run = id;
    source = new EventSource(api + "/runs/" + encodeURIComponent(id) + "/events/stream");
    source.onmessage = function (m) { onEvent(JSON.parse(m.data)); };
    source.addEventListener("token", function (m) { onToken(JSON.parse(m.data)); });
    source.onopen = function () { root.dataset.stream = "open"; };
    source.onerror = function () { root.dataset.stream = source.readyState === 2 ? "closed" : "reconnecting"; };
  }

  function onToken(d) {
    var r = live[d.request_id];
    if (!r || d.index === 0) {  // another reply, or this one written again (a retried call)
      if (r) { r.el.remove(); }
      r = live[d.request_id] = {el: bubble("assistant", "", {request: d.request_id, live: "1"}), tokens: 0};
      r.el.classList.add("chat-live");
    }
    r.el.textContent += d.text;
    r.tokens += 1;
    r.el.dataset.tokens = String(r.tokens);
  }

  function onEvent(e) {
    if (e.seq <= lastSeq) { return; }  // (sent again after a reconnection)
    lastSeq = e.seq;
    var d = e.data || {};
    switch (e.type) {
      case "aaa.run.started":
        if (d.input && d.input.task) { bubble("user", d.input.task, {turn: "1", seq: e.seq}); }
        break;
      case "aaa.message.received":
        awaitingMessage = false;
        bubble("user", d.content, {turn: String(d.turn), seq: e.seq});
        break;
      case "aaa.message.sent":
        awaitingMessage = true;
        var r = live[d.request_id];
        var el = r ? r.el : bubble("assistant", "", {request: d.request_id || ""});
        el.textContent = d.content;  // the log's text is the reply
        el.classList.remove("chat-live");
        el.dataset.final = "1";
        el.dataset.turn = String(d.turn);
        repliedTurn = d.turn;
        el.dataset.tokens = String(r ? r.tokens : 0);
        delete live[d.request_id];
        break;
      case "aaa.tool.requested":
        if (d.name !== "choose_city") {
          bubble("tool", "\u2192 " + d.name + "(" + JSON.stringify(d.args) + ")", {seq: e.seq});
        }
        break;
      case "aaa.question.asked":
        askForm(e);
        break;
      case "aaa.question.answered":
      case "aaa.question.expired":
        answered(d.request_id, e.type === "aaa.question.answered" ? d.answer : null, e.type);
        break;
      case "aaa.run.completed":
        awaitingMessage = false;
        bubble("tool", "The conversation ended: " + d.outcome +
               (d.value && d.value.reason ? " (" + d.value.reason + ")" : ""), {seq: e.seq});
        setStatus("ended");
        source.close();
        return;
    }
    if (typeof d.waits === "number") {  // an event that changes what the run waits for
      setStatus(d.waits > 0 ? "waiting" : "running");
    } else if (statusBox.dataset.status === "new") {
      setStatus("running");
    }
  }

  // -- questions: a form from the answer's JSON schema ------------------------------

  function field(name, schema, required) {
    var label = document.createElement("label");
    label.textContent = (schema.title || name || "answer") + " ";
    var el;
    if (Array.isArray(schema.enum)) {
      el = document.createElement("select");
      schema.enum.forEach(function (v) {
        var o = document.createElement("option");
        o.value = JSON.stringify(v);
        o.textContent = String(v);
        el.appendChild(o);
      });
      el.dataset.kind = "json";
    } else if (schema.type === "boolean") {
      el = document.createElement("input");
      el.type = "checkbox";
      el.dataset.kind = "bool";
    } else if (schema.type === "integer" || schema.type === "number") {
      el = document.createElement("input");
      el.type = "number";
      if (schema.type === "integer") { el.step = "1"; }
      el.dataset.kind = "number";
    } else if (schema.type === "string") {
      el = document.createElement("input");
      el.type = "text";
      el.dataset.kind = "text";
    } else {
      el = document.createElement("textarea");
      el.placeholder = "JSON";
      el.dataset.kind = "json";
    }
    el.name = name || "answer";
    el.required = !!required && el.type !== "checkbox";
    label.appendChild(el);
    return label;
  }

  function value(el) {
    if (el.dataset.kind === "bool") { return el.checked; }
    if (el.dataset.kind === "number") { return el.value === "" ? null : Number(el.value); }
    if (el.dataset.kind === "text") { return el.value; }
    return JSON.parse(el.value);
  }

  function askForm(e) {
    var d = e.data, id = e.id, schema = d.schema || {};
    var box = document.createElement("form");
    box.className = "chat-question";
    box.dataset.question = id;
    box.dataset.text = d.question;
    var p = document.createElement("p");
    p.textContent = d.question;
    box.appendChild(p);
    var props = schema.type === "object" && schema.properties ? schema.properties : null;
    if (props) {
      Object.keys(props).forEach(function (k) {
        box.appendChild(field(k, props[k], (schema.required || []).indexOf(k) >= 0));
      });
    } else {
      box.appendChild(field("", schema, true));
    }
    var errors = document.createElement("p");
    errors.className = "chat-errors";
    box.appendChild(errors);
    var button = document.createElement("button");
    button.type = "submit";
    button.textContent = "Answer";
    box.appendChild(button);
    box.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var answer;
      try {
        if (props) {
          answer = {};
          Object.keys(props).forEach(function (k) { answer[k] = value(box.elements[k]); });
        } else {
          answer = value(box.elements.answer);
        }
      } catch (err) {
        errors.textContent = "not JSON: " + err.message;
        return;
      }
      button.disabled = true;
      call("POST", "/runs/" + encodeURIComponent(runId) + "/questions/" + encodeURIComponent(id), {answer: answer})
        .then(function (res) {
          button.disabled = false;
          if (res.status !== 200) { errors.textContent = problem(res); return; }
          errors.textContent = "";
        });
    });
    questions[id] = box;
    questionsBox.appendChild(box);
    box.scrollIntoView({block: "end"});
  }

  function answered(id, answer, type) {
    var box = questions[id];
    if (!box) { return; }
    delete questions[id];
    box.remove();
    var text = box.dataset.text + " \u2014 " + (type === "aaa.question.expired"
      ? "it expired unanswered" : "you answered " + JSON.stringify(answer));
    bubble("tool", text, {question: id});
  }

  // -- sending ------------------------------------------------------------------------

  form.addEventListener("submit", function (ev) {
    ev.preventDefault();
    var content = input.value.trim();
    if (!content) { return; }
    showError("");
    send.disabled = true;
    if (!runId) {
      var body = JSON.parse(JSON.stringify(start));
      body.input = {task: content};
      call("POST", "/runs", body).then(function (res) {
        if (res.status !== 201) { showError(problem(res)); send.disabled = false; return; }
        input.value = "";
        history.replaceState(null, "", "?run=" + encodeURIComponent(res.body.id));
        setStatus("running");
        follow(res.body.id);
      });
      return;
    }
    var key = "msg-" + Date.now() + "-" + Math.random().toString(36).slice(2);
    call("POST", "/runs/" + encodeURIComponent(runId) + "/messages", {content: content}, {"Idempotency-Key": key})
      .then(function (res) {
        if (res.status !== 201 && res.status !== 200) { showError(problem(res)); setStatus(statusBox.dataset.status); return; }
        input.value = "";
        sentTurn = res.body.message.turn;  // no other message until its reply shows
        setStatus(statusBox.dataset.status);
      });
  });

  input.addEventListener("keydown", function (ev) {  // Enter sends, Shift+Enter is a new line
    if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); form.requestSubmit(); }
  });

  closeButton.addEventListener("click", function () {
    call("POST", "/runs/" + encodeURIComponent(runId) + "/close").then(function (res) {
      if (res.status !== 202) { showError(problem(res)); }
    });
  });

  setStatus("new");
  if (runId) { follow(runId); }
}());
