/* A layered DAG layout in near-linear time, for research DAGs too large for dagre.
 *
 * Why: dagre's crossing minimisation grows much faster than the graph (about 0.7 s for 300
 * nodes on a slow machine, minutes for 2,000), and a run page must draw a 2,000-node DAG in
 * under 2 s. This is the same idea (Sugiyama layers, left to right) with the cheap parts
 * only:
 *
 *   1. rank   = longest path from a source (Kahn's topological order), so every edge points right;
 *   2. order  = a few barycenter sweeps within each rank (down, then up), which removes most
 *               crossings of a tree-like DAG;
 *   3. place  = each node at the mean height of its neighbours in the previous rank, pushed
 *               apart to keep nodeSep, the rank then shifted back by its mean overshoot.
 *
 * No dummy nodes for long edges: an edge that skips ranks may cross a node. Small graphs still
 * use dagre (run.js picks), which draws those better.
 */
(function () {
  "use strict";

  function layeredPositions(nodes, edges, options) {
    const rankSep = options.rankSep || 70;
    const nodeSep = options.nodeSep || 18;
    const sweeps = options.sweeps || 4;
    const index = new Map(nodes.map((n, i) => [n.id, i]));
    const preds = nodes.map(() => []);
    const succs = nodes.map(() => []);
    for (const e of edges) {
      const s = index.get(e.source);
      const t = index.get(e.target);
      if (s === undefined || t === undefined || s === t) continue;
      preds[t].push(s);
      succs[s].push(t);
    }

    // 1. ranks by longest path, in topological order (a node left in a cycle keeps rank 0).
    const indegree = preds.map((p) => p.length);
    const rank = new Array(nodes.length).fill(0);
    const queue = [];
    indegree.forEach((d, i) => { if (d === 0) queue.push(i); });
    for (let head = 0; head < queue.length; head++) {
      const v = queue[head];
      for (const w of succs[v]) {
        rank[w] = Math.max(rank[w], rank[v] + 1);
        if (--indegree[w] === 0) queue.push(w);
      }
    }
    const layers = [];
    nodes.forEach((_, i) => { (layers[rank[i]] = layers[rank[i]] || []).push(i); });
    for (let r = 0; r < layers.length; r++) if (!layers[r]) layers[r] = [];

    // 2. order within ranks: barycenter sweeps.
    const position = new Float64Array(nodes.length);
    const renumber = (layer) => layer.forEach((v, i) => { position[v] = i; });
    layers.forEach(renumber);
    const sweep = (layer, neighbours) => {
      const key = new Map();
      for (const v of layer) {
        const ns = neighbours[v];
        if (ns.length) {
          let sum = 0;
          for (const u of ns) sum += position[u];
          key.set(v, sum / ns.length);
        } else {
          key.set(v, position[v]);
        }
      }
      layer.sort((a, b) => key.get(a) - key.get(b) || position[a] - position[b]);
      renumber(layer);
    };
    for (let s = 0; s < sweeps; s++) {
      if (s % 2 === 0) for (let r = 1; r < layers.length; r++) sweep(layers[r], preds);
      else for (let r = layers.length - 2; r >= 0; r--) sweep(layers[r], succs);
    }

    // 3. coordinates: x by rank, y near the neighbours' mean, kept nodeSep apart.
    const x = new Float64Array(nodes.length);
    const y = new Float64Array(nodes.length);
    let left = 0;
    for (const layer of layers) {
      const width = layer.reduce((m, v) => Math.max(m, nodes[v].w), 0);
      for (const v of layer) x[v] = left + width / 2;
      left += width + rankSep;
    }
    layers.forEach((layer, r) => {
      if (!layer.length) return;
      const wanted = layer.map((v, i) => {
        const ns = r === 0 ? [] : preds[v].filter((u) => rank[u] === r - 1);
        if (!ns.length) return null;
        let sum = 0;
        for (const u of ns) sum += y[u];
        return sum / ns.length;
      });
      // Nodes with no placed neighbour go where the stacking puts them.
      let cursor = -Infinity;
      layer.forEach((v, i) => {
        const gap = (i ? nodes[layer[i - 1]].h / 2 : 0) + nodes[v].h / 2 + (i ? nodeSep : 0);
        const want = wanted[i] === null ? cursor + gap : wanted[i];
        y[v] = i === 0 ? (wanted[i] === null ? 0 : want) : Math.max(want, cursor + gap);
        cursor = y[v];
      });
      // Pushing apart only moves nodes down; shift the layer back up by the mean overshoot,
      // which keeps the spacing and centres the layer on its parents.
      let over = 0;
      let counted = 0;
      layer.forEach((v, i) => { if (wanted[i] !== null) { over += y[v] - wanted[i]; counted += 1; } });
      if (counted) for (const v of layer) y[v] -= over / counted;
    });
    const out = {};
    nodes.forEach((n, i) => { out[n.id] = { x: x[i], y: y[i] }; });
    return out;
  }

  window.rsiLayered = { layeredPositions };
})();
