// The runs list: the ticked runs stay ticked while new runs arrive (kept in sessionStorage, keyed by
// uuid, so a reload, a new sort or a filter never moves the selection onto another run).
(function () {
  "use strict";
  const KEY = "rsiweb.runs.selected";

  function load() {
    try {
      const saved = JSON.parse(sessionStorage.getItem(KEY) || "[]");
      return new Set(Array.isArray(saved) ? saved : []);
    } catch (error) {
      return new Set();
    }
  }

  function save(selected) {
    sessionStorage.setItem(KEY, JSON.stringify(Array.from(selected)));
  }

  function setup() {
    const form = document.getElementById("compare-form");
    if (!form) return;
    const selected = load();
    const boxes = Array.from(document.querySelectorAll('input[type=checkbox][name=runs][form="compare-form"]'));
    const count = document.getElementById("selected-count");
    const shown = () => { if (count) count.textContent = String(selected.size); };
    boxes.forEach((box) => {
      box.checked = selected.has(box.value);
      box.addEventListener("change", () => {
        if (box.checked) selected.add(box.value); else selected.delete(box.value);
        save(selected);
        shown();
      });
    });
    // Ticked runs that this view does not list (filtered out, or beyond the page) still count:
    // they travel with the form as hidden inputs.
    const listed = new Set(boxes.map((box) => box.value));
    selected.forEach((uuid) => {
      if (listed.has(uuid)) return;
      const hidden = document.createElement("input");
      hidden.type = "hidden";
      hidden.name = "runs";
      hidden.value = uuid;
      hidden.dataset.offPage = "1";
      form.appendChild(hidden);
    });
    shown();
    document.body.dataset.selection = "ready";
  }

  document.addEventListener("DOMContentLoaded", setup);
})();
