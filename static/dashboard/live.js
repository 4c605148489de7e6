/* Live state of a page, fed by the websocket of apps/dashboard/consumers.py.
 *
 * The server sends a snapshot on connect (in parts), then events. This file keeps the state (records
 * keyed by uuid, per collection) and applies events to it with the one rule that the server's
 * selectors promise (apps/dashboard/selectors.py): an event's payload is a record, or a subset
 * of one with its key, and is merged into the record with that key. On reconnect the new
 * snapshot replaces the state: that is the resynchronisation, and there is no polling.
 */
(function () {
  "use strict";

  // Event prefix -> collection of the run snapshot. The event types are apps/live/events.py
  // LiveEvent: run.updated merges into the run; node.*, edge.*, decision.*, experiment.*,
  // guidance.*, report.*, job.* into their collections; prediction.* and evaluation.* are not
  // shown on the run page and are ignored (the experiment's own event brings its new score).
  const COLLECTIONS = {
    node: "nodes",
    edge: "edges",
    decision: "decisions",
    experiment: "experiments",
    guidance: "guidance",
    report: "reports",
    job: "jobs",
  };
  const LOG_LIMIT = 500;

  function keyOf(entity, record) {
    // An edge is keyed by its two ends (apps/dashboard/selectors.py); everything else by uuid.
    if (entity === "edge") return record.source && record.target ? `${record.source}>${record.target}` : null;
    return record.uuid;
  }

  /* A run snapshot as maps: {run: {...}, nodes: Map(uuid -> record), ...}. */
  function runStateFrom(snapshot) {
    const state = { run: Object.assign({}, snapshot.run) };
    for (const [entity, collection] of Object.entries(COLLECTIONS)) {
      state[collection] = new Map();
      for (const record of snapshot[collection] || []) state[collection].set(keyOf(entity, record), Object.assign({}, record));
    }
    return state;
  }

  /* The state back in the snapshot's shape (arrays in insertion order): what tests compare. */
  function runStateToSnapshot(state) {
    const out = { run: state.run };
    for (const collection of Object.values(COLLECTIONS)) out[collection] = Array.from(state[collection].values());
    return out;
  }

  /* Apply one event to a run state. Returns {entity, collection, key, created} or null. */
  function applyRunEvent(state, event, payload) {
    const entity = event.split(".", 1)[0];
    if (entity === "run") {
      Object.assign(state.run, payload);
      return { entity: "run", collection: "run", key: state.run.uuid, created: false };
    }
    const collection = COLLECTIONS[entity];
    if (!collection) return null; // prediction.*, evaluation.*: not on this page
    const key = keyOf(entity, payload);
    if (!key) return null;
    const existing = state[collection].get(key);
    const created = existing === undefined;
    const record = existing || {};
    if (event === "job.progress") {
      // The job engine's high-rate event: a subset plus a metrics point / log line that the run
      // page's job records fold in (the job page keeps the points and lines themselves).
      if (created) return null; // a job the snapshot did not have: its job.updated will bring it
      if (payload.progress !== undefined) record.progress = payload.progress;
      if (payload.metrics_point) record.metrics_last = Object.assign({}, record.metrics_last, payload.metrics_point);
    } else {
      Object.assign(record, payload);
    }
    if (created) state[collection].set(key, record);
    return { entity, collection, key, created };
  }

  /* The job page's state: {job, metrics_points: [], log: []}. */
  function jobStateFrom(snapshot) {
    return {
      job: Object.assign({}, snapshot.job),
      metrics_points: (snapshot.metrics_points || []).slice(),
      log: (snapshot.log || []).slice(),
    };
  }

  function applyJobEvent(state, event, payload) {
    if (!event.startsWith("job.") || payload.uuid !== state.job.uuid) return false;
    if (event === "job.progress") {
      if (payload.progress !== undefined) state.job.progress = payload.progress;
      if (payload.metrics_point) {
        state.metrics_points.push(payload.metrics_point);
        state.job.metrics_last = Object.assign({}, state.job.metrics_last, payload.metrics_point);
      }
      if (payload.log_line !== undefined) {
        state.log.push(payload.log_line);
        if (state.log.length > LOG_LIMIT) state.log.splice(0, state.log.length - LOG_LIMIT);
      }
    } else {
      Object.assign(state.job, payload);
    }
    return true;
  }

  /* A websocket that reconnects with backoff and hands snapshots and events to the page.
   * Close codes 4401 (signed out), 4403 (no access), 4404 (gone) stop the retries. */
  class LiveSocket {
    constructor(path, handlers) {
      this.path = path;
      this.handlers = handlers;
      this.retry = 0;
      this.closedForGood = false;
      this.socket = null;
      this.connect();
    }

    url() {
      const scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
      return `${scheme}//${window.location.host}${this.path}`;
    }

    connect() {
      this.setState("connecting");
      const socket = new WebSocket(this.url());
      this.socket = socket;
      let pending = null; // a snapshot arriving in parts (apps/dashboard/consumers.py)
      socket.onmessage = (message) => {
        const data = JSON.parse(message.data);
        if (data.type === "events") {
          for (const item of data.events) this.handlers.event(item.event, item.payload);
        } else if (data.type === "snapshot.begin") {
          pending = data.data;
        } else if (data.type === "snapshot.part" && pending) {
          for (const record of data.records) pending[data.key].push(record);
        } else if (data.type === "snapshot.end" && pending) {
          const snapshot = pending;
          pending = null;
          this.retry = 0;
          this.setState("live");
          this.handlers.snapshot(snapshot);
        }
      };
      socket.onclose = (close) => {
        if (close.code === 4401) {
          this.closedForGood = true;
          this.setState("signed out");
          window.location.assign(`/accounts/login/?next=${encodeURIComponent(window.location.pathname)}`);
          return;
        }
        if (close.code === 4403 || close.code === 4404) {
          this.closedForGood = true;
          this.setState(close.code === 4403 ? "no access" : "not found");
          return;
        }
        if (this.closedForGood) return;
        this.setState("reconnecting");
        // 0.5 s, 1 s, 2 s ... capped at 15 s, with jitter so a restarted server is not stormed.
        const delay = Math.min(15000, 500 * 2 ** this.retry) * (0.75 + Math.random() * 0.5);
        this.retry += 1;
        window.setTimeout(() => this.connect(), delay);
      };
    }

    close() {
      this.closedForGood = true;
      if (this.socket) this.socket.close();
    }

    setState(text) {
      if (this.handlers.state) this.handlers.state(text);
    }
  }

  window.rsiLive = {
    LiveSocket,
    keyOf,
    runStateFrom,
    runStateToSnapshot,
    applyRunEvent,
    jobStateFrom,
    applyJobEvent,
  };
})();
