// The job wizard's small behaviours: show the parts of a step its choices use, parameter rows, upload progress, and
// keeping htmx's refused submissions (HTTP 400: errors beside the fields) on the page. Without it every step still
// works as a plain form.
(function () {
  "use strict";

  // <div data-show-when="algorithm=manual|scala-opt-m"> is shown only while that field has one of those values;
  // rules joined by "&" must all hold.
  function showWhen(form) {
    form.querySelectorAll("[data-show-when]").forEach(function (element) {
      var rules = element.dataset.showWhen.split("&").map(function (rule) { return rule.split("="); });
      if (rules.some(function (rule) { return !form.elements[rule[0]]; })) return;
      element.hidden = !rules.every(function (rule) {
        return rule[1].split("|").indexOf(form.elements[rule[0]].value) !== -1;
      });
    });
  }

  function numberRows(params) {
    params.querySelectorAll("[data-param-row]").forEach(function (row, index) {
      row.querySelectorAll("[data-n]").forEach(function (n) { n.textContent = index + 1; });
      var remove = row.querySelector("[data-remove-row]");
      remove.hidden = false;
      remove.setAttribute("aria-label", "Remove parameter " + (index + 1));
    });
  }

  function init(root) {
    root.querySelectorAll("[data-js-only]").forEach(function (element) { element.hidden = false; });
    root.querySelectorAll("form").forEach(showWhen);
    root.querySelectorAll("[data-params]").forEach(numberRows);
    var summary = root.querySelector("[data-error-summary]");
    if (summary && root !== document) summary.focus();
  }

  document.addEventListener("DOMContentLoaded", function () { init(document); });
  document.addEventListener("htmx:load", function (event) { init(event.detail.elt); });
  ["change", "input"].forEach(function (type) {
    document.addEventListener(type, function (event) {
      if (event.target.form) showWhen(event.target.form);
    });
  });

  document.addEventListener("click", function (event) {
    var add = event.target.closest("[data-add-row]");
    var remove = event.target.closest("[data-remove-row]");
    if (!add && !remove) return;
    var params = (add || remove).closest("[data-params]");
    var rows = params.querySelector("[data-param-rows]");
    if (add) {
      var row = params.querySelector("[data-param-template]").content.firstElementChild.cloneNode(true);
      rows.appendChild(row);
      numberRows(params);
      row.querySelector("input").focus();
      return;
    }
    var current = remove.closest("[data-param-row]");
    var all = Array.prototype.slice.call(rows.querySelectorAll("[data-param-row]"));
    if (all.length === 1) {
      current.querySelectorAll("input").forEach(function (input) { input.value = ""; });
      current.querySelector("input").focus();
      return;
    }
    var next = all[all.indexOf(current) + 1] || all[all.indexOf(current) - 1];
    current.remove();
    numberRows(params);
    next.querySelector("input").focus();
  });

  // Upload progress: htmx reports the request body's progress on the form that sends it.
  function progressBox(event) {
    var form = event.target.closest && event.target.closest("[data-upload-form]");
    return form && form.querySelector("[data-upload-progress]");
  }
  document.addEventListener("htmx:beforeRequest", function (event) {
    var box = progressBox(event);
    if (!box) return;
    var hasFile = Array.prototype.some.call(event.target.querySelectorAll("input[type=file]"), function (input) {
      return input.files.length > 0 && !input.closest("[hidden]");
    });
    box.hidden = !hasFile;
    var refused = box.parentNode.querySelector("[data-upload-refused]");
    if (refused) refused.hidden = true;
  });
  document.addEventListener("htmx:xhr:progress", function (event) {
    var box = progressBox(event);
    if (!box || box.hidden || !event.detail.lengthComputable) return;
    var percent = Math.round((100 * event.detail.loaded) / event.detail.total);
    box.querySelector("progress").value = percent;
    box.querySelector("[data-upload-percent]").textContent = percent + " %";
  });

  // A refused step comes back as 400 with the errors beside its fields: show it like any other answer. An upload
  // over its limit is cut off by the server with a 413 whose body is the reason: show that above the form's buttons.
  document.addEventListener("htmx:beforeSwap", function (event) {
    var xhr = event.detail.xhr;
    if (xhr.status === 400) {
      event.detail.shouldSwap = true;
      event.detail.isError = false;
    } else if (xhr.status === 413) {
      var form = event.detail.requestConfig && event.detail.requestConfig.elt;
      var box = form && form.querySelector("[data-upload-progress]");
      var refused = box && box.parentNode.querySelector("[data-upload-refused]");
      if (!refused) return;
      event.detail.shouldSwap = false;
      event.detail.isError = false; // expected: the reason is shown, not logged as a failure
      box.hidden = true;
      refused.textContent = xhr.responseText.trim() || "The upload is larger than this page accepts.";
      refused.hidden = false;
      refused.focus();
    }
  });

  // The live recommendation panel never keeps an old answer beside new fields: an answer that did not come (the
  // server failed, or could not be reached) replaces it with why.
  function panelFailed(event, why) {
    var panel = event.detail.target;
    if (!panel || panel.id !== "recommendation") return;
    var box = document.createElement("p");
    box.className = "wz-reco-error";
    var strong = document.createElement("strong");
    strong.textContent = "No cluster shown. ";
    box.appendChild(strong);
    box.appendChild(document.createTextNode(why));
    panel.replaceChildren(box);
  }
  document.addEventListener("htmx:responseError", function (event) {
    panelFailed(event, "The platform could not answer for these fields (HTTP " + event.detail.xhr.status +
      "); change a field to ask again, or try again in a moment.");
  });
  document.addEventListener("htmx:sendError", function (event) {
    panelFailed(event, "The platform could not be reached; change a field to ask again once it is back.");
  });

  document.addEventListener("submit", function (event) {
    var question = event.target.dataset.confirm;
    if (question && !window.confirm(question)) event.preventDefault();
  });

  // One job per click on "Run job".
  document.addEventListener("submit", function (event) {
    if (!event.target.matches("[data-run-form]")) return;
    var button = event.target.querySelector("button[type=submit]");
    if (button.dataset.sent) {
      event.preventDefault();
      return;
    }
    button.dataset.sent = "1";
    button.textContent = "Starting…";
  });
})();
