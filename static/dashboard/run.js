/* The run page: research DAG and experiment graph (cytoscape + dagre), guidance, decisions,
 * jobs, reports and plotly charts, all kept live by the run's websocket (live.js).
 *
 * Rendering is batched per animation frame: a burst of events costs one redraw, not one per
 * event. Every text that came from an agent or a person is set with textContent, never parsed
 * as HTML.
 */
(function () {
  "use strict";

  const live = window.rsiLive;
  const config = JSON.parse(document.getElementById("page-config").textContent);
  const ZERO = "00000000-0000-0000-0000-000000000000";
  const url = (template, id) => template.replace(ZERO, id).replace("__id__", encodeURIComponent(id));

  let state = null;
  // Run records the page took from the server (run.* events, snapshots): a form's answer written
  // before one of them is older than what the page shows.
  let runRecordsSeen = 0;
  let selectedNode = null;
  let dagTouched = false; // the user zoomed or panned: later layouts keep their viewport
  let expTouched = false;

  // --- tiny DOM helpers ---------------------------------------------------------------------

  function h(tag, attrs, ...children) {
    const element = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "class") element.className = value;
      else if (name === "text") element.textContent = value;
      else if (name.startsWith("on")) element.addEventListener(name.slice(2), value);
      else element.setAttribute(name, value === true ? "" : value);
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      element.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return element;
  }

  const byId = (id) => document.getElementById(id);
  const fmtScore = (x) => (x === null || x === undefined ? "—" : Number(x).toFixed(3));
  function fmtTime(iso) {
    if (!iso) return "";
    const date = new Date(iso);
    return date.toLocaleString(undefined, { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit" });
  }

  function toast(text, kind) {
    let box = byId("toasts");
    if (!box) {
      box = h("div", { id: "toasts", class: "toasts", role: "status" });
      document.body.append(box);
    }
    const item = h("div", { class: `toast ${kind || ""}`, text });
    box.append(item);
    window.setTimeout(() => item.remove(), 6000);
  }

  // --- graphs -------------------------------------------------------------------------------

  const FONT = "system-ui, -apple-system, Segoe UI, sans-serif";
  const FIT_ZOOM_CAP = 1.15;
  const READABLE_ZOOM = 0.65; // 10 px labels drawn at 6.5 px: the smallest still legible
  // Node boxes of the two stylesheets below (layered.js needs them before cytoscape draws).
  const NODE_SIZE = {
    dag: { worker: { w: 118, h: 40 }, reviewer: { w: 128, h: 46 }, default: { w: 118, h: 40 } },
    exp: { default: { w: 78, h: 30 } },
  };
  // Above this many nodes a graph is laid out by layered.js instead of dagre (about 0.7 s for
  // 300 nodes with dagre on a slow machine, and it grows much faster than the graph).
  const DAGRE_LIMIT = 250;
  const dagStyle = [
    {
      selector: "node",
      style: {
        label: "data(label)",
        "font-family": FONT,
        "font-size": 10,
        "text-wrap": "wrap",
        "text-valign": "center", // text-halign: center is the default
        color: "#1f2933",
        width: 118,
        height: 40,
        shape: "round-rectangle",
        // Colours come with the data (STATUS_COLOURS): one mapping instead of a selector per
        // status keeps style matching cheap for thousands of nodes.
        "background-color": "data(fill)",
        "border-color": "data(stroke)",
        "border-width": 2,
        "min-zoomed-font-size": 6,
      },
    },
    { selector: "node[kind = 'reviewer']", style: { shape: "hexagon", width: 128, height: 46 } },
    { selector: "node.highlight", style: { "border-color": "#D55E00", "border-width": 4 } },
    { selector: "node:selected", style: { "border-color": "#D55E00", "border-width": 4, "overlay-opacity": 0 } },
    {
      selector: "edge",
      style: {
        width: 1.6,
        "curve-style": "bezier",
        "target-arrow-shape": "triangle",
        "arrow-scale": 0.9,
        "line-color": "#52606d",
        "target-arrow-color": "#52606d",
      },
    },
    {
      selector: "edge[kind = 'review_scope']",
      style: { "line-style": "dashed", "line-color": "#E69F00", "target-arrow-color": "#E69F00" },
    },
  ];

  const INTEGRITY_COLOUR = { accepted: "#009E73", pending: "#E69F00", flagged: "#D55E00" };
  const expStyle = [
    {
      selector: "node",
      style: {
        label: "data(label)",
        "font-family": FONT,
        "font-size": 9,
        "text-wrap": "wrap",
        "text-valign": "center",
        color: "#ffffff",
        "text-outline-width": 0,
        shape: "round-rectangle",
        width: 78,
        height: 30,
        "background-color": "data(colour)",
        "border-width": 0,
        "min-zoomed-font-size": 6,
      },
    },
    { selector: "node[status = 'running'], node[status = 'queued'], node[status = 'held']", style: { "border-width": 2, "border-style": "dashed", "border-color": "#1f2933", "background-opacity": 0.7 } },
    { selector: "node[status = 'failed'], node[status = 'cancelled'], node[status = 'rejected']", style: { "background-color": "#9aa5b1" } },
    { selector: "node.highlight", style: { "border-width": 3, "border-color": "#1f2933", "border-style": "solid" } },
    {
      selector: "edge",
      style: {
        width: 1.3,
        "curve-style": "bezier",
        "target-arrow-shape": "triangle",
        "arrow-scale": 0.8,
        "line-color": "#9aa5b1",
        "target-arrow-color": "#9aa5b1",
      },
    },
  ];

  function makeGraph(container, style) {
    return cytoscape({
      container,
      style,
      elements: [],
      minZoom: 0.005,
      maxZoom: 3,
      boxSelectionEnabled: false,
      autoungrabify: true,
      // Large graphs stay smooth while panning: draw a cached texture, skip edges mid-gesture.
      textureOnViewport: true,
      hideEdgesOnViewport: true,
      pixelRatio: 1,
    });
  }

  const dag = makeGraph(byId("dag"), dagStyle);
  const expGraph = makeGraph(byId("expgraph"), expStyle);
  window.rsiGraphs = { dag, exp: expGraph }; // for the browser tests and the console
  // A person who zoomed or dragged the view keeps it; programmatic fits do not count.
  function watchGestures(cy, container, touch) {
    let pressing = false;
    cy.on("tapstart", (e) => { pressing = e.target === cy; });
    cy.on("tapend", () => { pressing = false; });
    cy.on("pan", () => { if (pressing) touch(); });
    container.addEventListener("wheel", touch, { passive: true });
  }
  watchGestures(dag, byId("dag"), () => { dagTouched = true; });
  watchGestures(expGraph, byId("expgraph"), () => { expTouched = true; });

  const STATUS_COLOURS = {
    active: { fill: "#dbeafe", stroke: "#0072B2" },
    finalized: { fill: "#d1fae5", stroke: "#009E73" },
    cancelled: { fill: "#e5e7eb", stroke: "#9aa5b1" },
  };

  function dagNodeData(node) {
    const decision = node.decision ? state.decisions.get(node.decision) : null;
    const label = decision ? `${node.handle}\n${decision.kind}` : node.handle;
    const colours = STATUS_COLOURS[node.status] || STATUS_COLOURS.cancelled;
    return { id: node.uuid, label, kind: node.kind, status: node.status, ...colours };
  }

  function expNodeData(experiment) {
    const label = `${experiment.handle}\n${fmtScore(experiment.feedback_score)}`;
    return {
      id: experiment.uuid,
      label,
      status: experiment.status,
      integrity: experiment.integrity_status,
      colour: INTEGRITY_COLOUR[experiment.integrity_status] || "#9aa5b1",
      owner: experiment.owner,
    };
  }

  function upsert(cy, data, group) {
    const existing = cy.getElementById(data.id);
    if (existing.nonempty()) {
      existing.data(data);
      return false;
    }
    if (group === "edges" && (cy.getElementById(data.source).empty() || cy.getElementById(data.target).empty())) {
      return false; // its end has not arrived yet; added again when it does
    }
    cy.add({ group, data });
    return true;
  }

  const layouts = new Map();
  function scheduleLayout(cy, which) {
    if (layouts.has(which)) return;
    layouts.set(which, window.setTimeout(() => {
      layouts.delete(which);
      runLayout(cy, which);
    }, 60));
  }

  const SEPARATION = { dag: { nodeSep: 18, rankSep: 70 }, exp: { nodeSep: 10, rankSep: 40 } };

  /* Positions from layered.js, for graphs too large for dagre (its crossing minimisation is
   * far too slow past a few hundred nodes). Sizes come from the stylesheet's constants: asking
   * cytoscape (layoutDimensions) would compute every node's whole style first. */
  function layeredLayout(which, nodeData, edgeData) {
    const nodes = nodeData.map((d) => ({ id: d.id, ...(NODE_SIZE[which][d.kind] || NODE_SIZE[which].default) }));
    const positions = window.rsiLayered.layeredPositions(nodes, edgeData, SEPARATION[which]);
    return { nodes, positions };
  }

  /* Edges of a large graph: haystack (straight, no arrowheads; the layout runs left to right, so
   * direction reads from position), which is cytoscape's default curve with radius 0, so only the
   * width and colour are set. Bezier control points for thousands of edges cost more than they
   * show, and cytoscape applies a stylesheet property by property, element by element (each one
   * dirtying caches of the element and its neighbours): three edge properties instead of seven
   * for 2,500 edges is a good part of the first draw. */
  const LARGE_EDGE_STYLE = {
    dag: [
      { selector: "edge", style: { width: 1.6, "line-color": "#52606d" } },
      { selector: "edge[kind = 'review_scope']", style: { "line-style": "dashed", "line-color": "#E69F00" } },
    ],
    exp: [{ selector: "edge", style: { width: 1.3, "line-color": "#9aa5b1" } }],
  };

  function useLargeStyle(cy, which) {
    if (cy.scratch("large")) return;
    const base = which === "dag" ? dagStyle : expStyle;
    cy.style(base.filter((rule) => !rule.selector.startsWith("edge")).concat(LARGE_EDGE_STYLE[which]));
    cy.scratch("large", true);
  }

  /* After a graph was laid out: the first view, and the DAG's "first draw" stamps. */
  function laidOut(cy, which, started, touched) {
    // A small graph fitted to the box would be drawn huge; keep it at a readable size.
    if (!touched && cy.zoom() > FIT_ZOOM_CAP) {
      cy.zoom(FIT_ZOOM_CAP);
      cy.center();
    }
    if (which !== "dag") return;
    if (window.rsiDagLayoutMs === undefined) window.rsiDagLayoutMs = performance.now() - started;
    // The first draw after the first layout (cytoscape's "render" event follows a frame it
    // drew): what bench/dag_render.py times. rsiDagComplete: the first frame with every element
    // of the snapshot (later than rsiDagRendered when a large graph is filled in the background).
    cy.one("render", () => {
      if (window.rsiDagRendered === undefined) {
        window.rsiDagRendered = performance.now();
        window.rsiDagFirstFrame = { nodes: cy.nodes().length, edges: cy.edges().length };
      }
      if (!filling.has("dag")) dagComplete(cy);
    });
  }

  function dagComplete(cy) {
    if (window.rsiDagComplete === undefined) window.rsiDagComplete = performance.now();
    dagDrawn();
    document.body.dataset.dagNodes = String(cy.nodes().length);
  }

  /* Re-lay out a graph already on screen (it grew). */
  function runLayout(cy, which) {
    const fill = filling.get(which);
    if (fill) { fill.relayout = true; return; } // a layout of half the graph: wait for the rest
    const touched = which === "dag" ? dagTouched : expTouched;
    const started = performance.now();
    if (cy.nodes().length > DAGRE_LIMIT) {
      useLargeStyle(cy, which);
      const { nodes, positions } = layeredLayout(
        which,
        cy.nodes().map((n) => ({ id: n.id(), kind: n.data("kind") })),
        cy.edges().map((e) => ({ source: e.data("source"), target: e.data("target") }))
      );
      cy.batch(() => cy.nodes().positions((n) => positions[n.id()]));
      if (!touched) viewNewest(cy, nodes, positions);
      laidOut(cy, which, started, touched);
      return;
    }
    const layout = cy.layout({ name: "dagre", rankDir: "LR", ...SEPARATION[which], edgeSep: 8, animate: false, fit: !touched, padding: 24 });
    layout.one("layoutstop", () => laidOut(cy, which, started, touched));
    layout.run();
  }

  /* Replace a graph's elements (a snapshot arrived). A large graph gets its positions before
   * the elements are added, so cytoscape places each node once instead of moving 2,000, and
   * its first frame holds only the elements around the first view: cytoscape styles, measures
   * and bounds every element before its first frame (about 1 s for 2,000 nodes and 2,500 edges
   * on a busy two-core machine), but a readable zoom shows a tenth of such a graph. The rest is
   * added right after that frame, a slice per task (fillRest), so the page keeps answering. */
  function fillGraph(cy, which, nodeData, edgeData) {
    const touched = which === "dag" ? dagTouched : expTouched;
    const started = performance.now();
    const large = nodeData.length > DAGRE_LIMIT;
    filling.delete(which); // a newer snapshot replaces a fill still in progress
    if (!large) {
      cy.batch(() => {
        cy.elements().remove();
        cy.add(nodeData.map((data) => ({ group: "nodes", data })));
        cy.add(edgeData.map((data) => ({ group: "edges", data })));
      });
      runLayout(cy, which);
      return;
    }
    useLargeStyle(cy, which);
    const laid = layeredLayout(which, nodeData, edgeData);
    cy.batch(() => cy.elements().remove());
    if (!touched) viewNewest(cy, laid.nodes, laid.positions);
    const { first, rest } = splitByView(cy, laid, nodeData, edgeData);
    cy.batch(() => {
      cy.add(first.nodes.map((data) => ({ group: "nodes", data, position: laid.positions[data.id] })));
      cy.add(first.edges.map((data) => ({ group: "edges", data })));
    });
    if (rest.nodes.length || rest.edges.length) {
      const fill = { nodes: rest.nodes, edges: rest.edges, positions: laid.positions, relayout: false };
      filling.set(which, fill);
      // After the first frame: a slice started before it would delay it.
      cy.one("render", () => window.setTimeout(() => fillRest(cy, which, fill), 0));
    }
    laidOut(cy, which, started, touched);
  }

  const filling = new Map(); // which -> the part of a large snapshot not yet added
  const FILL_SLICE = 300; // nodes per task, with their edges: 100-200 ms on a busy machine

  /* The nodes whose boxes meet the first view, widened by half a view on every side (a small
   * pan or zoom finds them drawn), the edges touching them, and the far ends of those edges. */
  function splitByView(cy, laid, nodeData, edgeData) {
    const view = cy.extent();
    const mx = view.w / 2;
    const my = view.h / 2;
    const size = new Map(laid.nodes.map((n) => [n.id, n]));
    const near = new Set();
    for (const data of nodeData) {
      const p = laid.positions[data.id];
      const n = size.get(data.id);
      if (p.x + n.w / 2 >= view.x1 - mx && p.x - n.w / 2 <= view.x2 + mx && p.y + n.h / 2 >= view.y1 - my && p.y - n.h / 2 <= view.y2 + my) near.add(data.id);
    }
    const firstEdges = [];
    const restEdges = [];
    const ends = new Set(near);
    for (const data of edgeData) {
      if (near.has(data.source) || near.has(data.target)) {
        firstEdges.push(data);
        ends.add(data.source);
        ends.add(data.target);
      } else {
        restEdges.push(data);
      }
    }
    const firstNodes = [];
    const restNodes = [];
    for (const data of nodeData) (ends.has(data.id) ? firstNodes : restNodes).push(data);
    // Nearest the view first (the view is at the newest, right end: largest x first).
    const centre = (view.x1 + view.x2) / 2;
    restNodes.sort((a, b) => Math.abs(laid.positions[a.id].x - centre) - Math.abs(laid.positions[b.id].x - centre));
    return { first: { nodes: firstNodes, edges: firstEdges }, rest: { nodes: restNodes, edges: restEdges } };
  }

  /* A node's data as the live state has it now (an event may have changed it since the
   * snapshot). */
  function currentNodeData(which, data) {
    if (which === "dag") return state.nodes.has(data.id) ? dagNodeData(state.nodes.get(data.id)) : data;
    return state.experiments.has(data.id) ? expNodeData(state.experiments.get(data.id)) : data;
  }

  function addMissingEdge(cy, data) {
    if (cy.getElementById(data.id).empty() && cy.getElementById(data.source).nonempty() && cy.getElementById(data.target).nonempty()) {
      cy.add({ group: "edges", data });
    }
  }

  /* One slice of the rest of a large snapshot, then the next in a task of its own. Live events
   * may add some of these elements meanwhile (upsert): those are skipped here. */
  function fillRest(cy, which, fill) {
    if (filling.get(which) !== fill) return; // replaced by a newer snapshot
    const slice = fill.nodes.splice(0, FILL_SLICE);
    const added = new Set();
    cy.batch(() => {
      const nodes = [];
      for (const data of slice) {
        if (cy.getElementById(data.id).nonempty()) continue;
        nodes.push({ group: "nodes", data: currentNodeData(which, data), position: fill.positions[data.id] });
        added.add(data.id);
      }
      cy.add(nodes);
      const edges = [];
      const waiting = [];
      for (const data of fill.edges) {
        const ready = (added.has(data.source) || cy.getElementById(data.source).nonempty())
          && (added.has(data.target) || cy.getElementById(data.target).nonempty());
        if (!ready) waiting.push(data);
        else if (cy.getElementById(data.id).empty()) edges.push({ group: "edges", data });
      }
      fill.edges = waiting;
      cy.add(edges);
    });
    if (fill.nodes.length) {
      window.setTimeout(() => fillRest(cy, which, fill), 0);
      return;
    }
    filling.delete(which);
    // Edges that came live while their ends were still waiting here were dropped by upsert.
    if (which === "dag") {
      cy.batch(() => {
        for (const edge of state.edges.values()) addMissingEdge(cy, { id: live.keyOf("edge", edge), source: edge.source, target: edge.target, kind: edge.kind });
      });
      if (selectedNode && state.nodes.has(selectedNode)) cy.getElementById(selectedNode).select();
      cy.one("render", () => dagComplete(cy));
    } else {
      cy.batch(() => { for (const edge of expEdges(Array.from(state.experiments.values()))) addMissingEdge(cy, edge.data); });
    }
    if (fill.relayout) runLayout(cy, which);
  }

  /* The first view of a large graph, from precomputed positions (cy.fit measures every label
   * and edge: 0.7 s at 2,000 nodes). The whole graph when it stays readable; otherwise a
   * readable zoom on its newest part, the right end, where a live run grows. "Fit" shows all. */
  function viewNewest(cy, nodes, positions, padding = 24) {
    if (!nodes.length) return;
    let x1 = Infinity, y1 = Infinity, x2 = -Infinity, y2 = -Infinity;
    for (const n of nodes) {
      const p = positions[n.id];
      x1 = Math.min(x1, p.x - n.w / 2); x2 = Math.max(x2, p.x + n.w / 2);
      y1 = Math.min(y1, p.y - n.h / 2); y2 = Math.max(y2, p.y + n.h / 2);
    }
    const fit = Math.min(FIT_ZOOM_CAP, (cy.width() - 2 * padding) / (x2 - x1), (cy.height() - 2 * padding) / (y2 - y1));
    if (fit >= READABLE_ZOOM) {
      cy.viewport({ zoom: fit, pan: { x: (cy.width() - fit * (x1 + x2)) / 2, y: (cy.height() - fit * (y1 + y2)) / 2 } });
      return;
    }
    // Centre vertically on the nodes of the last screenful of ranks.
    const left = x2 - (cy.width() - 2 * padding) / READABLE_ZOOM;
    const recent = nodes.filter((n) => positions[n.id].x >= left).map((n) => positions[n.id].y);
    const middle = recent.reduce((a, b) => a + b, 0) / recent.length;
    cy.viewport({
      zoom: READABLE_ZOOM,
      pan: { x: cy.width() - padding - READABLE_ZOOM * x2, y: cy.height() / 2 - READABLE_ZOOM * middle },
    });
  }

  function rebuildGraphs() {
    const ids = new Set(state.nodes.keys());
    fillGraph(
      dag,
      "dag",
      Array.from(state.nodes.values()).map(dagNodeData),
      Array.from(state.edges.values())
        .filter((e) => ids.has(e.source) && ids.has(e.target))
        .map((e) => ({ id: live.keyOf("edge", e), source: e.source, target: e.target, kind: e.kind }))
    );
    const experiments = Array.from(state.experiments.values());
    fillGraph(expGraph, "exp", experiments.map(expNodeData), expEdges(experiments).map((edge) => edge.data));
    if (selectedNode && state.nodes.has(selectedNode)) dag.getElementById(selectedNode).select();
  }

  function expEdges(experiments) {
    const edges = [];
    for (const x of experiments) {
      for (const parent of x.parents || []) {
        if (state.experiments.has(parent)) edges.push({ group: "edges", data: { id: `${parent}>${x.uuid}`, source: parent, target: x.uuid } });
      }
    }
    return edges;
  }

  // --- side panel ---------------------------------------------------------------------------

  async function openPanel(nodeUuid) {
    selectedNode = nodeUuid;
    const panel = byId("node-panel");
    panel.hidden = false;
    const response = await fetch(url(config.urls.node, nodeUuid), { headers: { Accept: "application/json" } });
    if (!response.ok) {
      byId("panel-body").replaceChildren(h("p", { class: "error", text: `Could not load the node (${response.status}).` }));
      return;
    }
    const node = await response.json();
    if (selectedNode !== nodeUuid) return;
    byId("panel-title").textContent = `${node.handle}`;
    const decision = node.decision;
    const body = [
      h("p", {}, h("span", { class: `status status-${node.status}`, text: node.status }), " ", h("span", { class: "muted", text: `${node.kind} · created ${fmtTime(node.created_at)}` })),
      decision ? h("p", { class: "small" }, h("span", { class: `badge decision-${decision.kind}`, text: decision.kind }), ` on ${decision.trigger.replace("_", " ")}: `, decision.rationale) : null,
      h("h3", { text: node.kind === "reviewer" ? "Question" : "Task" }),
      h("p", { class: "prewrap", text: node.task || "—" }),
      h("h3", { text: "Summary" }),
      h("p", { class: "prewrap", text: node.summary || (node.status === "active" ? "Not finalized yet." : "—") }),
      node.transcript_url ? h("p", {}, h("a", { href: node.transcript_url, text: `Conversation (${node.transcript_turns} turns)` })) : null,
    ];
    if (node.upstream.length) {
      body.push(h("h3", { text: node.kind === "reviewer" ? "Reviews" : "Context from" }));
      body.push(h("p", {}, node.upstream.map((u) => [h("a", { href: "#", class: "noderef", "data-node": u.uuid, text: u.handle }), " "])));
    }
    if (node.downstream.length) {
      body.push(h("h3", { text: "Followed by" }));
      body.push(h("p", {}, node.downstream.map((d) => [h("a", { href: "#", class: "noderef", "data-node": d.uuid, text: `${d.handle} (${d.kind.replace("_", " ")})` }), " "])));
    }
    body.push(h("h3", { text: `Experiments (${node.experiments.length})` }));
    body.push(
      node.experiments.length
        ? h("ul", { class: "compact" }, node.experiments.map((x) =>
            h("li", {},
              h("a", { href: url(config.urls.experiment, x.handle), text: x.handle }), " ",
              h("span", { class: `badge integrity-${x.integrity_status}`, text: x.integrity_status }), " ",
              h("span", { class: "muted", text: `${x.status} · ${fmtScore(x.feedback_score)}` }))))
        : h("p", { class: "muted", text: "None." })
    );
    body.push(h("h3", { text: `Reports (${node.reports.length})` }));
    body.push(
      node.reports.length
        ? h("ul", { class: "compact" }, node.reports.map((r) => h("li", {}, h("a", { href: url(config.urls.report, r.uuid), text: r.status }), " ", r.summary)))
        : h("p", { class: "muted", text: "None." })
    );
    byId("panel-body").replaceChildren(...body.filter(Boolean));
  }

  function selectNode(uuid) {
    dag.elements().unselect();
    const element = dag.getElementById(uuid);
    if (element.nonempty()) {
      element.select();
      dag.animate({ center: { eles: element }, duration: 200 });
    }
    openPanel(uuid);
  }

  dag.on("tap", "node", (event) => openPanel(event.target.id()));
  expGraph.on("tap", "node", (event) => window.location.assign(url(config.urls.experiment, state.experiments.get(event.target.id()).handle)));
  byId("panel-close").addEventListener("click", () => {
    selectedNode = null;
    byId("node-panel").hidden = true;
    dag.elements().unselect();
  });
  document.addEventListener("click", (event) => {
    const ref = event.target.closest("[data-node]");
    if (!ref) return;
    event.preventDefault();
    selectNode(ref.dataset.node);
  });
  document.querySelectorAll("[data-fit]").forEach((button) => button.addEventListener("click", () => {
    if (button.dataset.fit === "dag") { dagTouched = false; dag.fit(undefined, 24); } else { expTouched = false; expGraph.fit(undefined, 24); }
  }));

  // --- lists and header ---------------------------------------------------------------------

  const dirty = new Set();
  let frame = null;
  function markDirty(...parts) {
    for (const part of parts) dirty.add(part);
    if (frame === null) frame = requestAnimationFrame(renderDirty);
  }

  function renderDirty() {
    frame = null;
    const parts = new Set(dirty);
    dirty.clear();
    if (!state) return;
    if (parts.has("header")) renderHeader();
    if (parts.has("guidance")) renderGuidance();
    if (parts.has("decisions")) renderDecisions();
    if (parts.has("jobs")) { renderJobs(); renderAccelerator(); }
    if (parts.has("reports")) renderReports();
  }

  const newestFirst = (records) => Array.from(records).sort((a, b) => (a.created_at < b.created_at ? 1 : a.created_at > b.created_at ? -1 : 0));

  function renderHeader() {
    const run = state.run;
    const status = byId("run-status");
    status.textContent = run.status;
    status.className = `status status-${run.status}`;
    const flaggedBadge = byId("run-flagged");
    // A violation ruled on a submission flags the run too (the server renders it; see runs_flag_reasons).
    flaggedBadge.hidden = !(run.flagged || flaggedBadge.dataset.violation === "1");
    let best = null;
    for (const x of state.experiments.values()) {
      if (x.integrity_status === "accepted" && x.status === "succeeded" && x.feedback_score !== null && x.feedback_score !== undefined) {
        best = best === null ? x.feedback_score : Math.max(best, x.feedback_score);
      }
    }
    byId("best-score").textContent = fmtScore(best);
    byId("experiment-count").textContent = String(state.experiments.size);
    byId("decision-count").textContent = String(state.decisions.size);
    byId("dag-empty").hidden = state.nodes.size > 0;
    byId("exp-empty").hidden = state.experiments.size > 0;
    renderAccelerator();
    setBudget("LLM tokens", run.used_llm_tokens, run.budget_llm_tokens, "tokens");
    renderWallClock();
    const controls = byId("run-control");
    if (controls) {
      const allowed = {
        pause: run.status === "running",
        resume: run.status === "paused",
        stop: ["created", "running", "paused"].includes(run.status),
      };
      controls.querySelectorAll("button[data-action]").forEach((b) => { b.disabled = !allowed[b.dataset.action]; });
    }
  }

  // The true share, above 100 % when a run overran (running jobs finish after a budget is spent);
  // only the bar's width stops at 100 %.
  function setBudget(label, used, total, unit) {
    const element = document.querySelector(`[data-budget="${label}"]`);
    if (!element) return;
    const percent = total > 0 ? Math.max(0, (100 * used) / total) : 0;
    const fill = element.querySelector(".fill");
    fill.style.width = `${Math.min(100, percent).toFixed(1)}%`;
    fill.classList.toggle("hot", percent >= 90);
    element.classList.toggle("over", percent > 100);
    element.querySelector(".budget-value").textContent = `${Math.round(percent)}%`;
    element.title = `${label}: ${Math.round(used)} of ${Math.round(total)} ${unit}${percent > 100 ? " (over budget)" : ""}`;
  }

  // Accelerator time is charged when a job ends; the jobs training now count too (as the
  // server's run_budget_state counts them), so the bar moves while they run.
  function renderAccelerator() {
    const run = state.run;
    const now = Date.now();
    let inFlight = 0;
    for (const j of state.jobs.values()) {
      if (j.status === "running" && j.queue === "gpu" && j.kind !== "final_eval" && j.started_at) {
        inFlight += Math.max(0, (now - new Date(j.started_at)) / 1000);
      }
    }
    setBudget("accelerator", run.used_accelerator_seconds + inFlight, run.budget_accelerator_seconds, "s");
  }

  function renderWallClock() {
    const run = state.run;
    if (!run.started_at) return;
    const end = run.finished_at ? new Date(run.finished_at) : new Date();
    setBudget("wall clock", (end - new Date(run.started_at)) / 1000, run.budget_wall_seconds, "s");
  }

  // Guidance reads as what happened to it: pending (not read yet), read (the Main Agent read it
  // but bound no decision yet), applied (a decision took it, and what that decision did), or
  // not carried out (the decision's every attempt was refused, e.g. two 409 worker_limit answers).
  function guidanceState(g, spawned) {
    if (!g.applied_at) return "pending";
    if (!g.applied_decision) return "read";
    return (g.refused || []).length && !spawned.length ? "failed" : "applied";
  }
  const GUIDANCE_BADGE = { pending: "pending", read: "read, no decision yet", applied: "applied", failed: "not carried out" };

  function renderGuidance() {
    const list = byId("guidance-list");
    const items = newestFirst(state.guidance.values()).map((g) => {
      const decision = g.applied_decision ? state.decisions.get(g.applied_decision) : null;
      const spawned = g.applied_decision
        ? Array.from(state.nodes.values()).filter((n) => n.decision === g.applied_decision) : [];
      const refused = g.refused || [];
      const status = guidanceState(g, spawned);
      return h("li", { class: `guidance ${status}`, "data-guidance": g.uuid },
        h("div", { class: "itemhead" },
          h("span", { class: `badge ${status}`, text: GUIDANCE_BADGE[status] }),
          h("span", { class: "muted small", text: `${g.author} · ${fmtTime(g.created_at)}` })),
        h("p", { class: "prewrap", text: g.text }),
        status === "pending" ? h("p", { class: "muted small", text: "Waiting for the Main Agent's next planning step." }) : null,
        status === "read" ? h("p", { class: "small", text: `Read ${fmtTime(g.applied_at)}; no decision has taken it yet.` }) : null,
        g.applied_decision ? h("p", { class: "small" },
          `Read ${fmtTime(g.applied_at)} by `,
          h("a", { href: `#decision-${g.applied_decision}`, class: "decisionref", "data-decision": g.applied_decision, text: decision ? `decision: ${decision.kind}` : "a decision" }),
          g.applied_note ? ` — ${g.applied_note}` : null) : null,
        decision && decision.rationale ? h("p", { class: "small muted prewrap", text: decision.rationale }) : null,
        g.applied_decision ? h("p", { class: "small outcome" },
          spawned.length ? ["did: spawned ", spawned.map((n) => [h("a", { href: "#", "data-node": n.uuid, text: n.handle }), " "])]
            : "did: spawned no Worker or Reviewer") : null,
        refused.length ? h("ul", { class: "compact small refused" }, refused.map((r) =>
          h("li", { class: "error", text: `failed: ${r.tool} refused ${r.count > 1 ? `${r.count}× ` : ""}(${r.status}${r.error ? ` ${r.error}` : ""})` }))) : null);
    });
    list.replaceChildren(...(items.length ? items : [h("li", { class: "muted small", text: "No guidance yet." })]));
  }

  function renderDecisions() {
    const spawned = new Map();
    for (const node of state.nodes.values()) {
      if (!node.decision) continue;
      if (!spawned.has(node.decision)) spawned.set(node.decision, []);
      spawned.get(node.decision).push(node);
    }
    const items = newestFirst(state.decisions.values()).slice(0, 60).map((d) => {
      const subject = d.subject ? state.nodes.get(d.subject) : null;
      const made = spawned.get(d.uuid) || [];
      return h("li", { id: `decision-${d.uuid}`, class: "decision" },
        h("div", { class: "itemhead" },
          h("span", { class: `badge decision-${d.kind}`, text: d.kind }),
          h("span", { class: "muted small", text: `${d.trigger.replace("_", " ")} · ${fmtTime(d.created_at)}` })),
        subject ? h("p", { class: "small" }, "on ", h("a", { href: "#", "data-node": subject.uuid, text: subject.handle })) : null,
        h("p", { class: "small prewrap", text: d.rationale }),
        made.length ? h("p", { class: "small" }, "spawned ", made.map((n) => [h("a", { href: "#", "data-node": n.uuid, text: n.handle }), " "])) : null);
    });
    byId("decision-list").replaceChildren(...(items.length ? items : [h("li", { class: "muted small", text: "No decisions yet." })]));
  }

  function renderJobs() {
    const active = Array.from(state.jobs.values()).filter((j) => j.status === "queued" || j.status === "running");
    const experimentHandle = new Map(Array.from(state.experiments.values()).map((x) => [x.uuid, x.handle]));
    const items = active.map((j) =>
      h("li", { class: "job" },
        h("div", { class: "itemhead" },
          h("a", { href: url(config.urls.job, j.uuid), text: `${j.kind}${j.experiment ? ` · ${experimentHandle.get(j.experiment) || "experiment"}` : ""}` }),
          h("span", { class: `status status-${j.status}`, text: j.status })),
        h("span", { class: "bar" }, h("span", { class: "fill", style: `width: ${(100 * (j.progress || 0)).toFixed(1)}%` }))));
    byId("job-list").replaceChildren(...(items.length ? items : [h("li", { class: "muted small", text: "No job is queued or running." })]));
  }

  function renderReports() {
    const items = newestFirst(state.reports.values()).map((r) => {
      const reviewer = state.nodes.get(r.reviewer);
      return h("li", {},
        h("div", { class: "itemhead" },
          h("a", { href: url(config.urls.report, r.uuid), text: `${reviewer ? reviewer.handle : "reviewer"} report` }),
          h("span", { class: "muted small", text: `${r.status} · ${fmtTime(r.created_at)}` })),
        h("p", { class: "small prewrap", text: r.summary }));
    });
    byId("report-list").replaceChildren(...(items.length ? items : [h("li", { class: "muted small", text: "No reports yet." })]));
  }

  document.addEventListener("click", (event) => {
    const ref = event.target.closest("[data-decision]");
    if (!ref) return;
    const uuid = ref.dataset.decision;
    dag.nodes().removeClass("highlight");
    dag.nodes(`[id]`).filter((n) => (state.nodes.get(n.id()) || {}).decision === uuid).addClass("highlight");
    const target = byId(`decision-${uuid}`);
    if (target) {
      target.classList.add("flash");
      window.setTimeout(() => target.classList.remove("flash"), 1500);
    }
  });

  // --- charts --------------------------------------------------------------------------------
  // Built by the server (apps/dashboard/charts.py) and fetched when an event says the run
  // changed, never on a timer. Only while the charts are on screen: building them costs the
  // server a few hundred ms and drawing them blocks this page for a moment, which is worth it
  // for a person looking at them and for no one else. Off screen, a change marks them stale and
  // they are fetched when scrolled to.

  let dagDrawn = null;
  const firstDraw = new Promise((resolve) => { dagDrawn = resolve; });
  const CHART_REFRESH_MS = 5000; // at most one refresh per 5 s however busy the run
  let chartTimer = null;
  let chartsVisible = false;
  let chartsStale = true;
  let chartsFetching = false;

  async function loadCharts() {
    chartTimer = null;
    if (!window.Plotly || chartsFetching) return;
    chartsFetching = true;
    chartsStale = false;
    try {
      const response = await fetch(config.urls.charts, { headers: { Accept: "application/json" } });
      if (!response.ok) return;
      const figures = await response.json();
      for (const [name, figure] of Object.entries(figures)) {
        chartFigures.set(name, figure);
        drawChart(name);
      }
      document.body.dataset.charts = "loaded";
    } finally {
      chartsFetching = false;
    }
  }

  // The last figure of each chart and its reader's options (smoothing, log scale: charts.js),
  // so moving a control redraws from what was fetched, without a request.
  const chartFigures = new Map();
  const chartOptions = new Map();

  function drawChart(name) {
    const element = byId(`chart-${name}`);
    const figure = chartFigures.get(name);
    if (!element || !figure) return;
    const card = element.closest(".chart");
    if (!chartOptions.has(name)) {
      const tools = (card.dataset.tools || "").split(/\s+/).filter(Boolean);
      chartOptions.set(name, { smoothing: 0, log: false });
      if (tools.length && window.rsiCharts) {
        window.rsiCharts.toolbar(card, { smoothing: tools.includes("smoothing"), log: tools.includes("log") },
          (options) => { chartOptions.set(name, options); drawChart(name); });
      }
    }
    const options = chartOptions.get(name);
    const charts = window.rsiCharts;
    const data = charts ? charts.withSmoothing(figure.data, options.smoothing, false) : figure.data;
    const layout = charts ? charts.withLogScale(figure.layout, options.log) : figure.layout;
    window.Plotly.react(element, data, layout, { displaylogo: false, responsive: true });
  }

  function scheduleCharts() {
    chartsStale = true;
    if (chartTimer !== null || !chartsVisible) return;
    chartTimer = window.setTimeout(loadCharts, CHART_REFRESH_MS);
  }

  function watchCharts() {
    const section = document.querySelector(".charts");
    new IntersectionObserver((entries) => {
      chartsVisible = entries.some((entry) => entry.isIntersecting);
      if (chartsVisible && chartsStale && chartTimer === null) loadCharts();
    }, { rootMargin: "200px" }).observe(section);
  }

  // --- the result -----------------------------------------------------------------------------
  // The result block is the server's (templates/dashboard/_run_result.html, apps.research.scores):
  // when the run finishes under a reader's eyes, take it from a fresh render of this page.
  let resultFetching = false;
  async function showResult() {
    if (resultFetching) return;
    resultFetching = true;
    try {
      const response = await fetch(window.location.pathname, { headers: { Accept: "text/html" }, credentials: "same-origin" });
      if (!response.ok) return;
      const fresh = new DOMParser().parseFromString(await response.text(), "text/html").getElementById("run-result");
      if (fresh && !byId("run-result")) document.querySelector(".runbar").before(document.importNode(fresh, true));
    } finally {
      resultFetching = false;
    }
  }

  // --- forms --------------------------------------------------------------------------------

  async function postForm(form, extra) {
    const body = new FormData(form);
    for (const [name, value] of Object.entries(extra || {})) body.set(name, value);
    // getAttribute, not form.action: the controls form has buttons named "action", which
    // shadow the property.
    const response = await fetch(form.getAttribute("action"), {
      method: "POST",
      body,
      headers: { Accept: "application/json", "X-CSRFToken": body.get("csrfmiddlewaretoken") },
      credentials: "same-origin",
    });
    const data = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(data.message || `Refused (${response.status}).`);
    return data;
  }

  const guidanceForm = byId("guidance-form");
  if (guidanceForm) {
    guidanceForm.addEventListener("submit", async (event) => {
      event.preventDefault();
      const button = guidanceForm.querySelector("button");
      button.disabled = true;
      try {
        const guidance = await postForm(guidanceForm);
        guidanceForm.reset();
        // The websocket brings the same record; applying it now shows it without waiting. If the
        // websocket brought it first, the state's record is as new or newer (a fast Main Agent may
        // have applied it already): this answer, written before that, must not set it back to pending.
        if (state && !state.guidance.has(guidance.uuid)) {
          live.applyRunEvent(state, "guidance.created", guidance);
          markDirty("guidance");
        }
      } catch (error) {
        toast(error.message, "error");
      } finally {
        button.disabled = false;
      }
    });
  }

  const controlForm = byId("run-control");
  if (controlForm) {
    controlForm.addEventListener("submit", async (event) => {
      event.preventDefault();
      const action = event.submitter ? event.submitter.value : "";
      if (action === "stop" && !window.confirm("Stop this run? Queued trainings are cancelled; running jobs finish, then the final evaluation runs.")) return;
      const seenBefore = runRecordsSeen;
      try {
        const run = await postForm(controlForm, { action });
        // As for guidance: a run record the websocket brought since the click is as new as this
        // answer or newer (the status may even have come back to what it was: paused, then resumed).
        if (state && runRecordsSeen === seenBefore) { live.applyRunEvent(state, "run.updated", run); markDirty("header"); }
      } catch (error) {
        toast(error.message, "error");
      }
    });
  }

  // --- the live state -----------------------------------------------------------------------

  function onSnapshot(snapshot) {
    const first = state === null;
    if (first) window.rsiSnapshotAt = performance.now();
    state = live.runStateFrom(snapshot);
    runRecordsSeen += 1;
    window.rsiRunState = state;
    // Links such as the experiment page's owner point at #node-<uuid>: open that node's panel.
    const linked = window.location.hash.match(/^#node-([0-9a-f-]{36})$/);
    if (first && linked && state.nodes.has(linked[1])) selectedNode = linked[1];
    rebuildGraphs();
    markDirty("header", "guidance", "decisions", "jobs", "reports");
    if (selectedNode) openPanel(selectedNode);
    scheduleCharts();
  }

  function onEvent(event, payload) {
    if (!state) return;
    const change = live.applyRunEvent(state, event, payload);
    if (window.rsiProbe) window.rsiProbe(event, payload);
    if (!change) return;
    switch (change.collection) {
      case "run":
        runRecordsSeen += 1;
        markDirty("header");
        scheduleCharts();
        if (state.run.status === "finished" && !byId("run-result")) showResult();
        break;
      case "nodes": {
        const node = state.nodes.get(change.key);
        if (upsert(dag, dagNodeData(node), "nodes")) {
          // Edges that arrived before this node now have both ends.
          for (const edge of state.edges.values()) {
            if (edge.source === node.uuid || edge.target === node.uuid) upsert(dag, { id: live.keyOf("edge", edge), source: edge.source, target: edge.target, kind: edge.kind }, "edges");
          }
          scheduleLayout(dag, "dag");
        }
        markDirty("header", "decisions", "guidance"); // a spawned node is what a guidance's decision did
        if (selectedNode === change.key) openPanel(selectedNode);
        break;
      }
      case "edges": {
        const edge = state.edges.get(change.key);
        if (upsert(dag, { id: live.keyOf("edge", edge), source: edge.source, target: edge.target, kind: edge.kind }, "edges")) scheduleLayout(dag, "dag");
        break;
      }
      case "decisions":
        // Only nodes on the graph: one still waiting in a large snapshot's fill gets its data then.
        for (const node of state.nodes.values()) if (node.decision === change.key && dag.getElementById(node.uuid).nonempty()) upsert(dag, dagNodeData(node), "nodes");
        markDirty("header", "decisions", "guidance");
        scheduleCharts();
        break;
      case "experiments": {
        const experiment = state.experiments.get(change.key);
        if (upsert(expGraph, expNodeData(experiment), "nodes")) {
          for (const edge of expEdges([experiment])) upsert(expGraph, edge.data, "edges");
          for (const other of state.experiments.values()) {
            if ((other.parents || []).includes(experiment.uuid)) upsert(expGraph, { id: `${experiment.uuid}>${other.uuid}`, source: experiment.uuid, target: other.uuid }, "edges");
          }
          scheduleLayout(expGraph, "exp");
        }
        markDirty("header", "jobs");
        if (selectedNode && selectedNode === experiment.owner) openPanel(selectedNode);
        scheduleCharts();
        break;
      }
      case "guidance":
        markDirty("guidance");
        break;
      case "jobs":
        markDirty("jobs");
        if (event !== "job.progress") scheduleCharts();
        break;
      case "reports":
        markDirty("reports");
        if (selectedNode) openPanel(selectedNode);
        break;
      default:
        break;
    }
  }

  function onState(text) {
    const badge = byId("live-state");
    badge.textContent = text;
    badge.className = `live live-${text.replace(/\s+/g, "-")}`;
    document.body.dataset.live = text;
  }

  window.setInterval(() => { if (state) { renderWallClock(); renderAccelerator(); } }, 10000); // a local clock, not a server poll
  window.rsiRunSocket = new live.LiveSocket(config.urls.ws, { snapshot: onSnapshot, event: onEvent, state: onState });
  // This script is deferred, so DOMContentLoaded comes after it and after plotly.js (deferred
  // later in the page, so the DAG need not wait for plotly's 4 MB to parse). Charts wait for
  // the DAG's first draw, then load when on screen (see the charts section above).
  document.addEventListener("DOMContentLoaded", () => firstDraw.then(watchCharts));
})();
