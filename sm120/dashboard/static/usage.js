// The dashboard's usage view: polls /dashboard/api/usage and fills two tables. Every value
// goes in as text (textContent): key names and models are whatever a client or an admin wrote.
"use strict";

(function () {
  const POLL_MS = 5000;

  function cell(value) {
    const td = document.createElement("td");
    td.textContent = value === null || value === undefined ? "—" : String(value);
    return td;
  }

  function fill(table, rows, columns) {
    const body = table.querySelector("tbody");
    body.replaceChildren(...rows.map((row) => {
      const tr = document.createElement("tr");
      tr.append(...columns.map((column) => cell(column(row))));
      return tr;
    }));
  }

  function ms(value) {
    return value === null || value === undefined ? null : Math.round(value);
  }

  async function poll() {
    try {
      const answer = await fetch("/dashboard/api/usage", { credentials: "same-origin" });
      if (!answer.ok) return;
      const data = await answer.json();
      fill(document.getElementById("usage-keys"), data.by_key || [], [
        (r) => r.key, (r) => r.requests, (r) => r.errors, (r) => r.prompt_tokens,
        (r) => r.cached_tokens, (r) => r.completion_tokens, (r) => ms(r.mean_ttft_ms),
      ]);
      fill(document.getElementById("usage-recent"), data.recent || [], [
        (r) => new Date(r.at * 1000).toLocaleTimeString(), (r) => r.key, (r) => r.model,
        (r) => r.status, (r) => r.prompt_tokens, (r) => r.completion_tokens, (r) => ms(r.ttft_ms),
      ]);
      const problem = document.getElementById("usage-problem");
      problem.hidden = !data.problem;
      problem.textContent = data.problem || "";
    } catch (error) {
      // The main view reports a gateway that is gone; this one waits for it.
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    poll();
    setInterval(poll, POLL_MS);
  });
})();
