// ratelimitd's web console: polls GET /v1/console/live and draws it, and
// runs the simulator through POST /v1/simulate. Plain JavaScript and the
// vendored uPlot; no build step. Read-only unless an admin token is given:
// it stays in this tab's sessionStorage and goes, as a Bearer header, only
// with calls to /admin/v1/ (`ratelimitdConsole.adminFetch`).
'use strict';
(() => {
  const $ = (id) => document.getElementById(id);
  // What the page drew, for people debugging it and for the browser test:
  // the uPlot instances (their `.data` is exactly what is plotted) and the
  // last answers.
  const hook = (window.ratelimitdConsole = {
    charts: { live: null, latency: null, simulation: [] },
    lastLive: null,
    lastSimulation: null,
    lastKey: null,
  });
  const colors = { allowed: '#1a7f37', denied: '#cf222e', degraded: '#bf8700', sent: '#8c959f', remaining: '#0969da' };

  // --- the admin token ---------------------------------------------------
  const TOKEN_KEY = 'ratelimitd.adminToken';
  const token = () => sessionStorage.getItem(TOKEN_KEY) || '';
  const showToken = () => {
    $('token-state').textContent = token() ? 'admin token set' : 'read-only';
  };
  $('token-form').addEventListener('submit', (event) => {
    event.preventDefault();
    const value = $('token').value.trim();
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    $('token').value = '';
    showToken();
  });
  $('token-forget').addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    showToken();
  });
  hook.adminFetch = (path, init = {}) => {
    if (!path.startsWith('/admin/v1/')) throw new Error('the admin token goes to /admin/v1/ only');
    const headers = new Headers(init.headers || {});
    if (token()) headers.set('authorization', `Bearer ${token()}`);
    return fetch(path, { ...init, headers });
  };
  showToken();

  // --- helpers ------------------------------------------------------------
  const width = (element) => Math.max(320, element.clientWidth || 800);
  const cell = (text, className) => {
    const td = document.createElement('td');
    td.textContent = text;
    if (className) td.className = className;
    return td;
  };
  const fillTable = (id, rows) => {
    const body = $(id).querySelector('tbody');
    body.replaceChildren(
      ...rows.map((cells) => {
        const tr = document.createElement('tr');
        tr.append(...cells);
        return tr;
      }),
    );
  };
  const sumOf = (arrays, length) => {
    const total = new Array(length).fill(0);
    for (const values of arrays) values.forEach((v, i) => (total[i] += v));
    return total;
  };
  const lastSum = (values, seconds) => values.slice(-seconds).reduce((a, b) => a + b, 0);

  // --- live ---------------------------------------------------------------
  const seriesId = (s) => [s.api, s.origin, s.name, s.algorithm].join('|');
  const seriesLabel = (s) =>
    `${s.api} · ${s.origin === 'request' ? 'request parameters' : `${s.origin} ${s.name}`} · ${s.algorithm}`;
  let knownSeries = '';

  function renderLive(view) {
    hook.lastLive = view;
    const state = $('store-state');
    state.textContent = view.store.serving ? 'store serving' : 'store NOT serving';
    state.className = `badge ${view.store.serving ? 'ok' : 'bad'}`;
    $('failure-policy').textContent = `failure policy ${view.failurePolicy}`;
    $('stores').textContent = `stores: ${view.store.stores.join(', ')}`;

    // The series picker, rebuilt only when the set of series changes.
    const select = $('live-series');
    const ids = view.series.map(seriesId).join('\n');
    if (ids !== knownSeries) {
      const chosen = select.value;
      knownSeries = ids;
      select.replaceChildren(new Option('every decision', ''));
      for (const s of view.series) select.append(new Option(seriesLabel(s), seriesId(s)));
      select.value = view.series.some((s) => seriesId(s) === chosen) ? chosen : '';
    }
    const shown = view.series.filter((s) => !select.value || seriesId(s) === select.value);
    const n = view.times.length;
    const data = [
      view.times,
      sumOf(shown.map((s) => s.allowed), n),
      sumOf(shown.map((s) => s.denied), n),
      sumOf(shown.map((s) => s.degraded), n),
    ];
    if (!hook.charts.live) {
      hook.charts.live = new uPlot(
        {
          title: 'Decisions per second',
          width: width($('live-chart')),
          height: 240,
          series: [
            {},
            { label: 'allowed', stroke: colors.allowed, width: 2 },
            { label: 'denied', stroke: colors.denied, width: 2 },
            { label: 'degraded', stroke: colors.degraded, width: 2 },
          ],
          axes: [{}, { label: 'per second' }],
        },
        data,
        $('live-chart'),
      );
    } else {
      hook.charts.live.setData(data);
    }

    // Store latency, for the stores called over the network.
    const remote = view.store.latency.filter((line) => line.store !== 'embedded');
    $('latency-block').hidden = remote.length === 0;
    if (remote.length > 0) {
      const latency = [
        view.times,
        ...remote.map((line) => line.meanSeconds.map((s) => s * 1000)),
        ...remote.map((line) => line.maxSeconds.map((s) => s * 1000)),
      ];
      if (!hook.charts.latency || hook.charts.latency.series.length !== latency.length) {
        if (hook.charts.latency) hook.charts.latency.destroy();
        hook.charts.latency = new uPlot(
          {
            width: width($('latency-chart')),
            height: 200,
            series: [
              {},
              ...remote.map((line) => ({ label: `${line.store} mean ms`, stroke: colors.remaining })),
              ...remote.map((line) => ({ label: `${line.store} max ms`, stroke: colors.degraded, dash: [4, 4] })),
            ],
            axes: [{}, { label: 'ms' }],
          },
          latency,
          $('latency-chart'),
        );
      } else {
        hook.charts.latency.setData(latency);
      }
    }

    fillTable(
      'series-table',
      view.series.map((s) => [
        cell(s.api),
        cell(s.origin === 'request' ? '(request parameters)' : `${s.origin} ${s.name}`),
        cell(s.algorithm),
        cell(lastSum(s.allowed, 60), 'n'),
        cell(lastSum(s.denied, 60), 'n'),
        cell(lastSum(s.degraded, 60), 'n'),
      ]),
    );
    fillTable(
      'keys-table',
      view.topDeniedKeys.map((k) => [cell(k.key, 'key'), cell(k.denied, 'n'), cell(k.overestimate, 'n')]),
    );
    fillTable(
      'quota-table',
      view.quota.map((q) => [
        cell(q.domain),
        cell(q.policy),
        cell(q.subscribers, 'n'),
        cell(q.assignedRequestsPerSecond.toFixed(2), 'n'),
      ]),
    );
    renderLeases(view.leases);
  }

  // Each leased policy: a heading row, then a row per holder (a client's
  // lease stream on one key) with its part of the policy's share.
  const percent = (part, whole) => (whole > 0 ? `${((100 * part) / whole).toFixed(1)}%` : '–');
  function renderLeases(leases) {
    $('leases-empty').hidden = leases.length > 0;
    $('leases-table').hidden = leases.length === 0;
    const rows = [];
    for (const policy of leases) {
      const heading = document.createElement('th');
      heading.colSpan = 7;
      const holders = policy.holders.length === 1 ? '1 holder' : `${policy.holders.length} holders`;
      heading.textContent = `${policy.policy}: ${holders}, ${policy.shareUnitsPerSecond.toFixed(2)} units/s in all`;
      rows.push([heading]);
      for (const holder of policy.holders) {
        rows.push([
          cell(holder.holder, 'key'),
          cell(holder.key, 'key'),
          cell(holder.shareUnitsPerSecond.toFixed(2), 'n'),
          cell(percent(holder.shareUnitsPerSecond, policy.shareUnitsPerSecond), 'n'),
          cell(holder.demandRequestsPerSecond.toFixed(2), 'n'),
          cell(holder.granted, 'n'),
          cell(holder.admitted, 'n'),
        ]);
      }
    }
    fillTable('leases-table', rows);
  }

  async function pollLive() {
    try {
      const answer = await fetch('/v1/console/live');
      if (!answer.ok) throw new Error(`HTTP ${answer.status}`);
      renderLive(await answer.json());
      $('live-state').textContent = '';
    } catch (err) {
      $('live-state').textContent = `(cannot read the live view: ${err.message})`;
    } finally {
      setTimeout(pollLive, 1000);
    }
  }
  $('live-series').addEventListener('change', () => hook.lastLive && renderLive(hook.lastLive));

  // --- the simulator ------------------------------------------------------
  // Seconds as a proto3 JSON duration, in whole milliseconds.
  const duration = (seconds) => `${(Math.round(Number(seconds) * 1000) / 1000).toFixed(3)}s`;
  const whole = (value) => String(Math.round(Number(value)));

  /** The SimulateRequest the form describes. */
  function simulationRequest(form) {
    const f = (name) => form.elements[name].value;
    const on = (name) => form.elements[name].checked;
    const limits = [];
    if (on('use_fixed'))
      limits.push({ name: 'fixed', fixedWindow: { limit: whole(f('fixed_limit')), window: duration(f('fixed_window')) } });
    if (on('use_sliding'))
      limits.push({ name: 'log', slidingWindow: { limit: whole(f('sliding_limit')), window: duration(f('sliding_window')) } });
    if (on('use_bucket'))
      limits.push({ name: 'bucket', tokenBucket: { capacity: whole(f('bucket_capacity')), refillPerSecond: Number(f('bucket_refill')) } });
    if (on('use_gcra'))
      limits.push({ name: 'gcra', gcra: { rate: whole(f('gcra_rate')), period: duration(f('gcra_period')), burst: whole(f('gcra_burst')) } });
    if (on('use_counter'))
      limits.push({ name: 'counter', slidingWindowCounter: { limit: whole(f('counter_limit')), window: duration(f('counter_window')) } });
    const shape = f('shape');
    const traffic = { shape, rate: Number(f('rate')), duration: duration(f('duration')), cost: whole(f('cost')) };
    if (shape === 'BURSTS' || shape === 'SAWTOOTH') traffic.period = duration(f('period'));
    return { limits, traffic, step: duration(Number(f('step')) / 1000) };
  }

  function drawSimulation(answer) {
    for (const chart of hook.charts.simulation) chart.destroy();
    hook.charts.simulation = [];
    const box = $('sim-charts');
    box.replaceChildren();
    const step = parseFloat(answer.step);
    const xs = answer.sent.map((_, k) => Number((k * step).toFixed(3)));
    for (const limit of answer.limits) {
      const holder = document.createElement('div');
      const title = document.createElement('h3');
      title.textContent = `${limit.name || limit.algorithm} (${limit.algorithm}, limit ${limit.limit}): ` +
        `${limit.admittedTotal} admitted, ${limit.deniedTotal} denied`;
      const plot = document.createElement('div');
      holder.append(title, plot);
      box.append(holder);
      const stepped = uPlot.paths.stepped({ align: 1 });
      hook.charts.simulation.push(
        new uPlot(
          {
            width: Math.max(380, holder.clientWidth || 420),
            height: 220,
            scales: { x: { time: false } },
            series: [
              { label: 's' },
              { label: 'sent', stroke: colors.sent, paths: stepped },
              { label: 'admitted', stroke: colors.allowed, width: 2, paths: stepped },
              { label: 'denied', stroke: colors.denied, width: 2, paths: stepped },
              { label: 'remaining', stroke: colors.remaining, scale: 'remaining', dash: [5, 3] },
            ],
            axes: [
              { label: 'simulated seconds' },
              { label: 'requests per step' },
              { scale: 'remaining', side: 1, label: 'remaining', grid: { show: false } },
            ],
          },
          [xs, answer.sent, limit.admitted, limit.denied, limit.remaining.map(Number)],
          plot,
        ),
      );
    }
  }

  $('sim-form').addEventListener('submit', async (event) => {
    event.preventDefault();
    const state = $('sim-state');
    const request = simulationRequest(event.target);
    state.className = 'muted';
    state.textContent = 'running…';
    try {
      const answer = await fetch('/v1/simulate', {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(request),
      });
      const body = await answer.json();
      if (!answer.ok) {
        state.className = 'error';
        state.textContent = body.field ? `${body.field}: ${body.rule}` : `${body.code}: ${body.message}`;
        return;
      }
      drawSimulation(body);
      hook.lastSimulation = { request, answer: body };
      state.textContent = `${body.sent.reduce((a, b) => a + b, 0)} requests in ${body.sent.length} steps`;
    } catch (err) {
      state.className = 'error';
      state.textContent = `the simulation failed: ${err.message}`;
    }
  });

  // --- a key: peek and reset (admin) ---------------------------------------
  async function onKey(action) {
    const state = $('key-state');
    const answerBox = $('key-answer');
    answerBox.textContent = '';
    if (!token()) {
      state.className = 'error';
      state.textContent = 'give the admin token first (top right)';
      return;
    }
    let body;
    try {
      body = JSON.parse($('key-request').value);
    } catch (err) {
      state.className = 'error';
      state.textContent = `not JSON: ${err.message}`;
      return;
    }
    state.className = 'muted';
    state.textContent = `${action}…`;
    try {
      const answer = await hook.adminFetch(`/admin/v1/${action}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });
      const text = await answer.text();
      let shown = text;
      try {
        shown = JSON.stringify(JSON.parse(text), null, 2);
      } catch (_) {
        // Not JSON: shown as it came.
      }
      hook.lastKey = { action, status: answer.status, body: text };
      state.className = answer.ok ? 'muted' : 'error';
      state.textContent = `${action}: ${answer.status}`;
      answerBox.textContent = shown;
    } catch (err) {
      state.className = 'error';
      state.textContent = `${action} failed: ${err.message}`;
    }
  }
  $('key-peek').addEventListener('click', () => onKey('peek'));
  $('key-reset').addEventListener('click', () => onKey('reset'));

  pollLive();
})();
