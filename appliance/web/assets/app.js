// Status page: polls the JSON API and redraws in place. All data goes into
// the DOM through textContent, never as HTML.
(function () {
  'use strict';

  var REFRESH = Number(document.body.dataset.refreshMs) || 2000;
  var MAX_ROWS = 100;
  var SVG = 'http://www.w3.org/2000/svg';

  var TRAFFIC = !!document.body.dataset.traffic;
  var HISTORY = !!document.body.dataset.history;
  var EVENTS = !!document.body.dataset.events;
  var COLS = TRAFFIC ? 6 : 5;

  var services = [];
  var headTotal = null; // while only the first rows are here: how many Services there are
  var servicesRevision = null;
  var openKey = null; // the Service whose detail view is open
  var traffic = {};   // namespace/name → the counters of its ports, summed
  var trafficAt = null;
  var hist = {};      // namespace/name → its ports' history, summed point by point
  var histStep = 0, histFetched = 0, histTimes = [];
  var detail = null;  // the open Service's traffic panel, kept across redraws

  function $(id) { return document.getElementById(id); }

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function svgEl(tag, attrs) {
    var e = document.createElementNS(SVG, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    return e;
  }

  function setText(id, text, cls) {
    var e = $(id);
    if (!e) return;
    e.textContent = text;
    if (cls !== undefined) e.className = cls;
  }

  function fmtNum(n) { return Number(n || 0).toLocaleString('en-US'); }

  function plural(n, word) { return fmtNum(n) + ' ' + word + (n === 1 ? '' : 's'); }

  function fmtSeconds(s) {
    if (s === undefined || s === null) return '–';
    if (s === 0) return '0';
    if (s < 0.001) return (s * 1e6).toFixed(0) + ' µs';
    if (s < 1) return (s * 1e3).toFixed(s < 0.01 ? 2 : 1) + ' ms';
    if (s < 120) return s.toFixed(2) + ' s';
    return fmtAge(s);
  }

  function fmtAge(s) {
    if (s < 1) return 'just now';
    if (s < 60) return Math.floor(s) + 's';
    if (s < 3600) return Math.floor(s / 60) + 'm ' + Math.floor(s % 60) + 's';
    if (s < 172800) return Math.floor(s / 3600) + 'h ' + Math.floor((s % 3600) / 60) + 'm';
    return Math.floor(s / 86400) + 'd';
  }

  function ago(s) { return s === undefined || s === null ? 'never' : (s < 1 ? 'just now' : fmtAge(s) + ' ago'); }

  // mark keeps the first time a step of the page's loading was reached,
  // for the browser test's timings.
  function mark(name) { if (!performance.getEntriesByName(name).length) performance.mark(name); }

  function getJSON(path) {
    return fetch(path, { cache: 'no-store', credentials: 'same-origin' }).then(function (r) {
      if (!r.ok) throw new Error(path + ': HTTP ' + r.status);
      return r.json();
    });
  }

  // ---- status ----
  function renderStatus(st) {
    var state = st.healthy ? 'ok' : (st.ready ? 'bad' : 'wait');
    $('state').className = 'state ' + state;
    setText('state-word', st.healthy ? 'Healthy' : (st.ready ? 'Unhealthy' : 'Starting'));
    setText('state-reason', st.healthy ? 'Rules are programmed and the kernel matches the desired state.' : st.reason);
    var sy = st.sync;
    setText('f-last-sync', ago(sy.lastSyncAgeSeconds));
    setText('f-kernel-match', sy.firstSyncDone ? (sy.kernelMatches ? 'in sync' : 'drift') : '–',
      sy.firstSyncDone && !sy.kernelMatches ? 'bad' : '');
    setText('f-services', fmtNum(st.services.total));

    setText('c-duration', sy.syncs ? fmtSeconds(sy.lastDurationSeconds) : '–');
    setText('c-kind', sy.lastKind || '–');
    setText('c-changes', fmtNum(sy.lastChanges));
    setText('c-counts', fmtNum(sy.syncs) + ' / ' + fmtNum(sy.failures), sy.failing ? 'bad' : '');
    setText('c-error', sy.lastError ? sy.lastError : 'none', sy.lastError ? (sy.failing ? 'err' : 'warn') : 'good');
    setText('c-table', st.identity.table || '–', 'mono');
    setText('c-chains', fmtNum(sy.chains));
    setText('c-rules', fmtNum(sy.rules));
    setText('c-elements', fmtNum(sy.mapElements));
    setText('c-source', st.identity.source || '–', 'mono');
    var kube = (st.identity.source || '') === 'kubernetes';
    setText('c-api', kube ? (st.identity.apiConnected ? 'connected' : 'disconnected') : 'not used',
      kube ? (st.identity.apiConnected ? 'good' : 'bad') : '');
    setText('c-endpoints', fmtNum(st.services.endpoints));
    setText('c-noeps', fmtNum(st.services.noEndpoints), st.services.noEndpoints ? 'warn' : '');
    var files = st.sourceProblems.length, rejected = st.services.rejected;
    setText('c-rejected', files ? plural(files, 'file') + (rejected ? ', ' + plural(rejected, 'Service') : '') : fmtNum(rejected),
      files || rejected ? 'bad' : '');
    setText('c-kernel-refused', fmtNum(st.services.kernelRefused), st.services.kernelRefused ? 'bad' : '');
    setText('c-warnings', fmtNum(st.services.withWarnings), st.services.withWarnings ? 'warn' : '');
    var list = $('source-problems-list');
    list.replaceChildren.apply(list, st.sourceProblems.map(function (p) { return el('li', '', p); }));
    $('source-problems').hidden = !files;
    var ct = st.conntrack;
    setText('c-ct-cleanups', fmtNum(ct.cleanups));
    setText('c-ct-deleted', fmtNum(ct.flowsDeleted));
    setText('c-ct-duration', ct.cleanups ? fmtSeconds(ct.lastDurationSeconds) : '–');
    setText('c-ct-errors', fmtNum(ct.errors), ct.errors ? 'bad' : '');
    setText('c-uname', st.identity.kernel || '–', 'mono');
    setText('c-uptime', fmtAge(st.identity.uptimeSeconds));
    setText('node-name', st.identity.nodeName || '(unnamed node)', 'node');
    setText('version', st.identity.version || '', 'muted');
    document.title = 'nftgate' + (st.identity.nodeName ? ' · ' + st.identity.nodeName : '') +
      (st.healthy ? '' : ' · ' + (st.ready ? 'UNHEALTHY' : 'starting'));
  }

  // ---- charts ----
  function niceMax(v) {
    if (!(v > 0)) return 1;
    var p = Math.pow(10, Math.floor(Math.log10(v)));
    var steps = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < steps.length; i++) if (steps[i] * p >= v) return steps[i] * p;
    return 10 * p;
  }

  function chartFrame(box, maxV) {
    // R keeps the newest point clear of the right edge, where half of its
    // marker would be cut off.
    var W = 600, H = 130, L = 56, R = 6, T = 8, B = 16;
    var svg = svgEl('svg', { viewBox: '0 0 ' + W + ' ' + H, preserveAspectRatio: 'none' });
    for (var i = 0; i <= 2; i++) {
      var y = T + (H - T - B) * (1 - i / 2);
      svg.appendChild(svgEl('line', { x1: L, x2: W, y1: y, y2: y, class: 'grid' }));
      var t = svgEl('text', { x: L - 6, y: y + 3, 'text-anchor': 'end', class: 'axis' });
      t.textContent = fmtSeconds(maxV * i / 2);
      svg.appendChild(t);
    }
    box.replaceChildren(svg);
    return { svg: svg, W: W, H: H, L: L, T: T, B: B, ph: H - T - B, pw: W - L - R };
  }

  function noData(box, text) {
    var svg = svgEl('svg', { viewBox: '0 0 600 130' });
    var t = svgEl('text', { x: 300, y: 70, 'text-anchor': 'middle', class: 'none' });
    t.textContent = text;
    svg.appendChild(t);
    box.replaceChildren(svg);
  }

  function renderCharts(data) {
    var samples = data.samples || [];
    var box = $('chart-duration');
    if (!samples.length) {
      noData(box, 'no syncs yet');
    } else {
      var maxD = niceMax(Math.max.apply(null, samples.map(function (s) { return s.durationSeconds; })));
      var f = chartFrame(box, maxD);
      var n = Math.max(samples.length, 30);
      var bw = f.pw / n;
      samples.forEach(function (s, i) {
        var h = Math.max(1.5, f.ph * s.durationSeconds / maxD);
        var kind = s.error ? 'failed' : (s.kind === 'full' ? 'full' : 'partial');
        var r = svgEl('rect', {
          x: f.L + (n - samples.length + i) * bw + bw * 0.15, y: f.T + f.ph - h,
          width: Math.max(1, bw * 0.7), height: h, rx: 1.5, class: 'bar ' + kind
        });
        var title = svgEl('title', {});
        title.textContent = new Date(s.time).toLocaleTimeString() + ' · ' + s.kind + ' · ' +
          fmtSeconds(s.durationSeconds) + ' · ' + fmtNum(s.changes) + ' changes' + (s.error ? ' · ' + s.error : '');
        r.appendChild(title);
        f.svg.appendChild(r);
      });
    }

    var lat = samples.filter(function (s) { return s.programmingLatencySeconds > 0; });
    box = $('chart-latency');
    if (!lat.length) {
      noData(box, 'no measured changes yet');
      return;
    }
    var maxL = niceMax(Math.max.apply(null, lat.map(function (s) { return s.programmingLatencySeconds; })));
    var g = chartFrame(box, maxL);
    var m = Math.max(lat.length, 30);
    var step = g.pw / (m - 1 || 1);
    var pts = lat.map(function (s, i) {
      return [g.L + (m - lat.length + i) * step, g.T + g.ph * (1 - s.programmingLatencySeconds / maxL), s];
    });
    var d = pts.map(function (p, i) { return (i ? 'L' : 'M') + p[0].toFixed(1) + ' ' + p[1].toFixed(1); }).join(' ');
    var base = (g.T + g.ph).toFixed(1);
    g.svg.appendChild(svgEl('path', { d: d + ' L' + pts[pts.length - 1][0].toFixed(1) + ' ' + base + ' L' + pts[0][0].toFixed(1) + ' ' + base + ' Z', class: 'area' }));
    g.svg.appendChild(svgEl('path', { d: d, class: 'line' }));
    pts.forEach(function (p) {
      var c = svgEl('circle', { cx: p[0], cy: p[1], r: 2.5, class: 'pt' });
      var title = svgEl('title', {});
      title.textContent = new Date(p[2].time).toLocaleTimeString() + ' · ' + fmtSeconds(p[2].programmingLatencySeconds);
      c.appendChild(title);
      g.svg.appendChild(c);
    });
  }

  // ---- services ----
  // searchText mirrors serviceSearchText in server.go.
  function searchText(s) {
    var parts = [s.namespace + '/' + s.name, s.type];
    parts = parts.concat(s.clusterIPs, s.externalIPs, s.loadBalancerIPs);
    s.ports.forEach(function (p) {
      parts.push(p.port + '/' + p.protocol, p.name);
      if (p.nodePort) parts.push(String(p.nodePort));
    });
    s.endpoints.forEach(function (e) { parts.push(e.addr, e.node || ''); });
    return parts.join(' ').toLowerCase();
  }

  function usedCount(s) {
    var n = 0;
    s.endpoints.forEach(function (e) { if (e.used) n++; });
    return n;
  }

  // A Service the gateway rejected before it ever programmed it comes with
  // only its name and the error: there is no state to show.
  function programmed(s) { return !!s.type; }

  function hasProblem(s) {
    return !!s.error || !!s.kernelError || s.warnings.length > 0 || (s.type !== 'ExternalName' && usedCount(s) === 0);
  }

  // problemLines shows what is wrong with a Service: why it was rejected,
  // why the kernel refused its rules, what of it is not served.
  function problemLines(box, s) {
    if (s.error) box.appendChild(el('div', 'svc-err', s.error));
    if (s.kernelError) {
      var k = el('div', 'svc-kerr');
      k.appendChild(el('span', 'lbl', 'kernel refused, last good state kept: '));
      k.appendChild(document.createTextNode(s.kernelError));
      box.appendChild(k);
    }
    if (s.warnings.length) {
      var ul = el('ul', 'svc-warn');
      s.warnings.forEach(function (w) { ul.appendChild(el('li', '', w)); });
      box.appendChild(ul);
    }
  }

  function addrLine(label, addrs) {
    var d = el('div', 'addr');
    d.appendChild(el('span', 'lbl', label));
    d.appendChild(document.createTextNode(addrs.join(', ')));
    return d;
  }

  function policyCell(td, s) {
    var ext = el('div');
    ext.appendChild(document.createTextNode('ext '));
    ext.appendChild(el('span', s.externalTrafficPolicy === 'Local' ? 'local' : '', s.externalTrafficPolicy || '–'));
    ext.appendChild(document.createTextNode(' · int '));
    ext.appendChild(el('span', s.internalTrafficPolicy === 'Local' ? 'local' : '', s.internalTrafficPolicy || '–'));
    td.appendChild(ext);
    if (s.sessionAffinity === 'ClientIP') {
      td.appendChild(el('div', '', 'affinity ClientIP' + (s.affinityTimeoutSeconds ? ' ' + fmtAge(s.affinityTimeoutSeconds) : '')));
    }
    if (s.loadBalancerSourceRanges.length) td.appendChild(el('div', 'mono', 'from ' + s.loadBalancerSourceRanges.join(', ')));
    if (s.healthCheckNodePort) td.appendChild(el('div', 'muted', 'health :' + s.healthCheckNodePort));
  }

  function serviceRow(s) {
    var key = s.namespace + '/' + s.name;
    var tr = el('tr', [s.error ? 'rejected' : '', s.kernelError ? 'refused' : '', s.warnings.length ? 'warned' : '',
      key === openKey ? 'open' : ''].filter(Boolean).join(' '));
    tr.dataset.key = key;

    var td = el('td');
    var open = el('button', 'svc-open');
    open.type = 'button';
    open.title = 'details';
    open.setAttribute('aria-expanded', String(key === openKey));
    open.appendChild(el('span', 'svc-ns', s.namespace + '/'));
    open.appendChild(el('span', 'svc-name', s.name));
    open.addEventListener('click', function () {
      openKey = openKey === key ? null : key;
      renderServices();
    });
    td.appendChild(open);
    problemLines(td, s);
    tr.appendChild(td);

    td = el('td');
    if (programmed(s)) td.appendChild(el('span', 'badge ' + s.type, s.type));
    else td.appendChild(el('span', 'muted', '–'));
    tr.appendChild(td);

    td = el('td');
    if (s.clusterIPs.length) td.appendChild(addrLine('cluster', s.clusterIPs));
    if (s.externalIPs.length) td.appendChild(addrLine('external', s.externalIPs));
    if (s.loadBalancerIPs.length) td.appendChild(addrLine('lb', s.loadBalancerIPs));
    var ports = el('div', 'ports');
    s.ports.forEach(function (p) {
      var c = el('span', 'port', (p.name ? p.name + ' ' : '') + p.port + '/' + p.protocol);
      if (p.nodePort) c.appendChild(el('span', 'np', ' · node ' + p.nodePort));
      ports.appendChild(c);
    });
    td.appendChild(ports);
    tr.appendChild(td);

    td = el('td', 'pol');
    if (!programmed(s)) td.appendChild(el('span', 'muted', 'not programmed'));
    else if (s.type === 'ExternalName') td.appendChild(el('span', 'muted', 'DNS alias, not proxied'));
    else policyCell(td, s);
    tr.appendChild(td);

    td = el('td');
    var eps = el('div', 'eps');
    var byAddr = {};
    var order = [];
    s.endpoints.forEach(function (e) {
      var g = byAddr[e.addr];
      if (!g) { g = byAddr[e.addr] = { e: e, ports: [], used: false }; order.push(e.addr); }
      if (g.ports.indexOf(e.port) < 0) g.ports.push(e.port);
      g.used = g.used || e.used;
    });
    order.forEach(function (a) {
      var g = byAddr[a], e = g.e;
      var state = g.used ? 'used' : (e.terminating ? 'term' : (e.ready || e.serving ? '' : 'down'));
      var label = (a.indexOf(':') >= 0 ? '[' + a + ']' : a) + ':' + g.ports.join(',');
      var chip = el('span', 'ep ' + state, label);
      if (e.node) chip.appendChild(el('span', 'node', e.node));
      chip.title = [g.used ? 'in use' : 'not in use', e.ready ? 'ready' : 'not ready',
        e.serving ? 'serving' : 'not serving', e.terminating ? 'terminating' : '',
        e.node ? 'node ' + e.node : '', e.zone ? 'zone ' + e.zone : ''].filter(Boolean).join(' · ');
      eps.appendChild(chip);
    });
    var proxied = programmed(s) && s.type !== 'ExternalName';
    if (!order.length && proxied) eps.appendChild(el('span', 'none', 'no endpoints'));
    else if (order.length && !usedCount(s) && proxied) eps.appendChild(el('span', 'none', 'none usable'));
    td.appendChild(eps);
    tr.appendChild(td);
    if (TRAFFIC) tr.appendChild(trafficCell(key));
    return tr;
  }

  // detailRow is the detail view of one Service, under its row: every
  // field, the problems in full, and each endpoint with its state.
  function detailRow(s) {
    var tr = el('tr', 'detail');
    tr.dataset.detailKey = s.namespace + '/' + s.name;
    var td = el('td');
    td.colSpan = COLS;
    var dl = el('dl', 'kv detail-kv');
    function item(label, value, cls) {
      dl.appendChild(el('dt', '', label));
      var dd = el('dd', cls || '');
      if (typeof value === 'string') dd.textContent = value;
      else dd.appendChild(value);
      dl.appendChild(dd);
    }
    item('Service', s.namespace + '/' + s.name, 'mono');
    item('Type', s.type || 'not programmed');
    if (s.clusterIPs.length) item('Cluster IPs', s.clusterIPs.join(', '), 'mono');
    if (s.externalIPs.length) item('External IPs', s.externalIPs.join(', '), 'mono');
    if (s.loadBalancerIPs.length) item('Load balancer IPs', s.loadBalancerIPs.join(', '), 'mono');
    if (s.ports.length) {
      item('Ports', s.ports.map(function (p) {
        return (p.name ? p.name + ' ' : '') + p.port + '/' + p.protocol + (p.nodePort ? ' node ' + p.nodePort : '');
      }).join(', '), 'mono');
    }
    if (s.error) item('Rejected', s.error, 'd-error err');
    item('Kernel', s.kernelError ? 'refused this Service\'s rules; its last good state stays: ' + s.kernelError : (programmed(s) ? 'rules accepted' : '–'),
      s.kernelError ? 'd-kernel err' : 'd-kernel');
    var ul = el('ul', 'd-warnings');
    s.warnings.forEach(function (w) { ul.appendChild(el('li', '', w)); });
    if (!s.warnings.length) ul.appendChild(el('li', 'muted', 'none'));
    item('Warnings', ul);
    var eps = el('ul', 'd-endpoints');
    s.endpoints.forEach(function (e) {
      eps.appendChild(el('li', 'mono', (e.portName ? e.portName + ' ' : '') + (e.addr.indexOf(':') >= 0 ? '[' + e.addr + ']' : e.addr) + ':' + e.port + ' · ' +
        [e.used ? 'in use' : 'not in use', e.ready ? 'ready' : 'not ready', e.terminating ? 'terminating' : '',
          e.node ? 'node ' + e.node : '', e.zone ? 'zone ' + e.zone : ''].filter(Boolean).join(' · ')));
    });
    if (!s.endpoints.length) eps.appendChild(el('li', 'muted', 'none'));
    item('Endpoints', eps);
    td.appendChild(dl);
    if (TRAFFIC && programmed(s)) {
      var p = trafficPanel(s);
      p.s = s;
      drawPanel();
      td.appendChild(p.box);
    }
    tr.appendChild(td);
    return tr;
  }

  // ---- traffic ----
  function fmtRate(r) { return (r >= 10 ? r.toFixed(0) : r >= 1 ? r.toFixed(1) : r > 0 ? r.toFixed(2) : '0') + '/s'; }

  function fmtBytes(b) {
    if (!b) return '0 B';
    var u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'], i = 0;
    while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
    return (i ? b.toFixed(b < 10 ? 1 : 0) : b) + ' ' + u[i];
  }

  // renderTraffic sums the counters of each Service's ports.
  function setTraffic(v) {
    var by = {};
    v.ports.forEach(function (p) {
      var key = p.namespace + '/' + p.name;
      var t = by[key] || (by[key] = { new: 0, rate: 0, flows: 0, rejected: 0, dropped: 0, bytes: 0, bytesIn: 0, bytesOut: 0, endpoints: {}, epBytes: {} });
      t.new += p.newConnections; t.rate += p.newPerSecond; t.flows += p.activeFlows;
      t.rejected += p.rejected; t.dropped += p.dropped; t.bytes += p.bytes;
      t.bytesIn += p.bytesIn; t.bytesOut += p.bytesOut;
      p.endpoints.forEach(function (e) {
        t.endpoints[e.endpoint] = (t.endpoints[e.endpoint] || 0) + e.activeFlows;
        t.epBytes[e.endpoint] = (t.epBytes[e.endpoint] || 0) + e.bytesIn + e.bytesOut;
      });
    });
    traffic = by;
    trafficAt = v.readAt;
  }

  function setHistory(v) {
    var by = {};
    var n = v.times.length;
    v.ports.forEach(function (p) {
      var key = p.namespace + '/' + p.name;
      var h = by[key] || (by[key] = { new: new Array(n).fill(0), refused: new Array(n).fill(0), flows: new Array(n).fill(0) });
      for (var i = 0; i < n; i++) {
        h.new[i] += p.newPerSecond[i]; h.refused[i] += p.refusedPerSecond[i]; h.flows[i] += p.flows[i];
      }
    });
    hist = by;
    histStep = v.stepSeconds;
    histTimes = v.times;
    var span = $('history-span');
    if (span) span.textContent = n ? 'last ' + fmtAge(n * histStep) + ', a point per ' + fmtAge(histStep) : '';
  }

  // spark draws a Service's recent new and refused connections per second
  // (areas) and its active flows (a line, on its own scale).
  function spark(h, W, H, cls) {
    var svg = svgEl('svg', { viewBox: '0 0 ' + W + ' ' + H, preserveAspectRatio: 'none', class: cls });
    var n = h.new.length;
    if (n < 1) return svg;
    var maxR = Math.max.apply(null, h.new.concat(h.refused)) || 1;
    var maxF = Math.max.apply(null, h.flows) || 1;
    var x = function (i) { return n === 1 ? W : (i * W / (n - 1)); };
    function path(vals, max, area) {
      var d = vals.map(function (v, i) { return (i ? 'L' : 'M') + x(i).toFixed(1) + ' ' + (H - 1 - (H - 2) * v / max).toFixed(1); }).join(' ');
      return area ? d + ' L' + x(n - 1).toFixed(1) + ' ' + H + ' L' + x(0).toFixed(1) + ' ' + H + ' Z' : d;
    }
    svg.appendChild(svgEl('path', { d: path(h.new, maxR, true), class: 's-new' }));
    if (h.refused.some(function (v) { return v > 0; })) svg.appendChild(svgEl('path', { d: path(h.refused, maxR, true), class: 's-refused' }));
    svg.appendChild(svgEl('path', { d: path(h.flows, maxF, false), class: 's-flows' }));
    var title = svgEl('title', {});
    title.textContent = 'last ' + fmtAge(n * histStep) + ': up to ' + fmtRate(Math.max.apply(null, h.new)) + ' new, ' +
      fmtNum(Math.max.apply(null, h.flows)) + ' flows' + (h.refused.some(function (v) { return v > 0; }) ? ', up to ' + fmtRate(Math.max.apply(null, h.refused)) + ' refused' : '');
    svg.appendChild(title);
    return svg;
  }

  function trafficCell(key) {
    var td = el('td', 'traffic');
    var t = traffic[key];
    if (!t) {
      td.appendChild(el('span', 'muted', '–'));
      return td;
    }
    var nums = el('div', 'tnums');
    nums.appendChild(el('span', 't-new', fmtNum(t.new) + ' new'));
    nums.appendChild(el('span', 't-rate', fmtRate(t.rate)));
    nums.appendChild(el('span', 't-flows', plural(t.flows, 'flow')));
    if (t.bytesIn || t.bytesOut) {
      var tb = el('span', 't-bytes', '↓' + fmtBytes(t.bytesIn) + ' ↑' + fmtBytes(t.bytesOut));
      tb.title = 'bytes from clients (↓ in) and replies (↑ out) since the start';
      nums.appendChild(tb);
    }
    if (t.rejected) nums.appendChild(el('span', 't-rejected', fmtNum(t.rejected) + ' rejected'));
    if (t.dropped) nums.appendChild(el('span', 't-dropped', fmtNum(t.dropped) + ' dropped'));
    td.appendChild(nums);
    if (hist[key]) td.appendChild(spark(hist[key], 160, 28, 'spark'));
    return td;
  }

  var sortKeys = {
    new: function (t) { return t.new; }, rate: function (t) { return t.rate; }, flows: function (t) { return t.flows; },
    rejected: function (t) { return t.rejected; }, dropped: function (t) { return t.dropped; },
    traffic: function (t) { return t.bytesIn + t.bytesOut; }
  };

  // trafficPanel is the open Service's traffic: its chart, each
  // endpoint's share of its open flows, the top clients and the live
  // flows with their search. It is made once per opened Service and kept
  // across redraws of the table, so a search being typed survives them.
  function trafficPanel(s) {
    var key = s.namespace + '/' + s.name;
    if (detail && detail.key === key) return detail;
    var box = el('div', 'traffic-detail');
    box.dataset.trafficKey = key;
    var chart = el('div', 'd-chart');
    var shares = el('ul', 'd-shares');
    var clients = el('ol', 'd-clients');
    var search = el('input', 'd-flow-search');
    search.type = 'search';
    search.placeholder = 'Search flows: client, endpoint, state…';
    search.setAttribute('aria-label', 'search flows');
    search.autocomplete = 'off';
    search.spellcheck = false;
    var count = el('span', 'd-flows-count muted');
    var table = el('table', 'd-flows');
    var head = el('tr');
    ['Client', 'Endpoint', 'Protocol', 'State', 'Age', 'Expires in', 'Bytes'].forEach(function (h) { head.appendChild(el('th', '', h)); });
    var thead = el('thead');
    thead.appendChild(head);
    var tbody = el('tbody');
    table.appendChild(thead);
    table.appendChild(tbody);
    function section(title, body, extra) {
      var d = el('div', 'd-sec');
      var h = el('h3', '', title);
      d.appendChild(h);
      if (extra) extra.forEach(function (x) { d.appendChild(x); });
      d.appendChild(body);
      return d;
    }
    var grid = el('div', 'd-grid');
    if (HISTORY) grid.appendChild(section('Last hour', chart));
    grid.appendChild(section('Endpoints\' share of open flows and bytes', shares));
    grid.appendChild(section('Top clients', clients));
    box.appendChild(grid);
    var wrap = el('div', 'table-wrap');
    wrap.appendChild(table);
    box.appendChild(section('Live flows', wrap, [search, count]));
    detail = { key: key, s: s, box: box, chart: chart, shares: shares, clients: clients, search: search, count: count, tbody: tbody, seq: 0 };
    var wait = 0;
    search.addEventListener('input', function () {
      clearTimeout(wait);
      wait = setTimeout(loadFlows, 150);
    });
    drawPanel();
    loadFlows();
    return detail;
  }

  // drawPanel draws what comes from the traffic counters and history.
  function drawPanel() {
    if (!detail) return;
    var t = traffic[detail.key];
    var h = hist[detail.key];
    if (HISTORY) {
      if (h) detail.chart.replaceChildren(spark(h, 600, 90, 'spark big'));
      else detail.chart.replaceChildren(el('span', 'muted', 'no traffic in the last hour'));
    }
    var known = {};
    detail.s.endpoints.forEach(function (e) { known[(e.addr.indexOf(':') >= 0 ? '[' + e.addr + ']' : e.addr) + ':' + e.port] = e; });
    var eps = t ? Object.keys(t.endpoints) : [];
    var total = eps.reduce(function (a, k) { return a + t.endpoints[k]; }, 0);
    var totalBytes = eps.reduce(function (a, k) { return a + t.epBytes[k]; }, 0);
    eps.sort(function (a, b) { return t.endpoints[b] - t.endpoints[a] || t.epBytes[b] - t.epBytes[a] || (a < b ? -1 : 1); });
    detail.shares.replaceChildren.apply(detail.shares, eps.map(function (k) {
      var n = t.endpoints[k], nb = t.epBytes[k];
      var li = el('li', known[k] ? '' : 'gone');
      li.dataset.endpoint = k;
      li.dataset.flows = String(n);
      li.dataset.bytes = String(nb);
      li.appendChild(el('span', 'mono', k));
      var bar = el('span', 'share');
      var fill = el('i');
      fill.style.width = (total ? 100 * n / total : 0).toFixed(1) + '%';
      bar.appendChild(fill);
      li.appendChild(bar);
      li.appendChild(el('span', 'num', plural(n, 'flow') + (total ? ' · ' + Math.round(100 * n / total) + '%' : '')));
      if (totalBytes) {
        var bbar = el('span', 'share bytes');
        var bfill = el('i');
        bfill.style.width = (100 * nb / totalBytes).toFixed(1) + '%';
        bbar.appendChild(bfill);
        li.appendChild(bbar);
        li.appendChild(el('span', 'num', fmtBytes(nb) + ' · ' + Math.round(100 * nb / totalBytes) + '% of bytes'));
      }
      if (!known[k]) li.appendChild(el('span', 'warn', 'removed: draining'));
      return li;
    }));
    if (!eps.length) detail.shares.appendChild(el('li', 'muted', 'no open flows'));
  }

  function loadFlows() {
    if (!detail) return Promise.resolve();
    var d = detail, seq = ++d.seq;
    var q = d.search.value.trim();
    var parts = d.key.split('/');
    return getJSON('api/v1/services/' + encodeURIComponent(parts[0]) + '/' + encodeURIComponent(parts[1]) + '/flows?limit=100' +
      (q ? '&q=' + encodeURIComponent(q) : '')).then(function (v) {
      if (d !== detail || seq !== d.seq) return; // a later search or another Service
      d.tbody.replaceChildren.apply(d.tbody, v.flows.map(function (f) {
        var tr = el('tr');
        [[f.client, 'mono'], [f.endpoint, 'mono'], [f.protocol], [f.state || '–'], [f.ageSeconds ? fmtAge(f.ageSeconds) : '–'],
          [fmtAge(f.timeoutSeconds)], [fmtBytes(f.bytes)]].forEach(function (c) { tr.appendChild(el('td', c[1] || '', c[0])); });
        return tr;
      }));
      d.count.textContent = (q ? fmtNum(v.total) + ' of ' : '') + plural(v.all, 'flow') + (v.truncated ? ', the first ' + v.flows.length + ' shown' : '');
      d.clients.replaceChildren.apply(d.clients, v.topClients.map(function (c) {
        var li = el('li');
        li.appendChild(el('span', 'mono', c.address));
        li.appendChild(el('span', 'num', plural(c.flows, 'flow') + ' · ' + fmtBytes(c.bytes)));
        return li;
      }));
      if (!v.topClients.length) d.clients.appendChild(el('li', 'muted', 'none'));
    });
  }

  // ---- events ----
  function renderEvents(v) {
    var body = $('events-body');
    body.replaceChildren.apply(body, v.events.map(function (e) {
      var li = el('li', 'ev ' + e.kind + ' ' + e.level.toLowerCase());
      li.appendChild(el('time', 'muted', new Date(e.time).toLocaleTimeString()));
      li.appendChild(el('span', 'kind', e.kind));
      li.appendChild(el('span', 'msg', e.message));
      var attrs = Object.keys(e.attrs || {}).sort().map(function (k) { return k + '=' + e.attrs[k]; }).join(' ');
      if (attrs) li.appendChild(el('span', 'attrs mono', attrs));
      return li;
    }));
    if (!v.events.length) body.appendChild(el('li', 'muted', 'No events yet.'));
    setText('events-count', fmtNum(v.total) + ' since the start' + (v.events.length < v.total ? ', the last ' + fmtNum(v.events.length) + ' shown' : ''), 'muted');
  }

  function renderServices() {
    var q = $('search').value.trim().toLowerCase();
    var typ = $('type-filter').value;
    var problems = $('problems').checked;
    var by = TRAFFIC && sortKeys[$('sort').value];
    // Only the first rows by name are here yet: a filter or another order
    // waits for the whole list.
    var waiting = headTotal !== null && !!(q || typ || problems || by);
    var all = headTotal !== null ? headTotal : services.length;
    var rows = waiting ? [] : services.filter(function (s) {
      if (typ && s.type !== typ) return false;
      if (problems && !hasProblem(s)) return false;
      return !q || s._text.indexOf(q) >= 0;
    });
    var matched = headTotal !== null ? (waiting ? 0 : headTotal) : rows.length;
    if (by) {
      var none = { new: 0, rate: 0, flows: 0, rejected: 0, dropped: 0, bytesIn: 0, bytesOut: 0 };
      rows.sort(function (a, b) {
        return by(traffic[b.namespace + '/' + b.name] || none) - by(traffic[a.namespace + '/' + a.name] || none);
      });
    }
    if (detail && (detail.key !== openKey)) detail = null;
    var body = $('svc-body');
    var frag = document.createDocumentFragment();
    rows.slice(0, MAX_ROWS).forEach(function (s) {
      frag.appendChild(serviceRow(s));
      if (s.namespace + '/' + s.name === openKey) frag.appendChild(detailRow(s));
    });
    if (!rows.length) {
      var tr = el('tr', waiting ? 'loading' : 'empty');
      var td = el('td', '', waiting ? 'Loading all ' + fmtNum(all) + ' services to filter…' : (all ? 'No services match the filter.' : 'No services.'));
      td.colSpan = COLS;
      tr.appendChild(td);
      frag.appendChild(tr);
    } else if (matched > MAX_ROWS) {
      var more = el('tr', 'more');
      var mtd = el('td', '', 'Showing the first ' + MAX_ROWS + ' — refine the filter to see the other ' + fmtNum(matched - MAX_ROWS) + '.');
      mtd.colSpan = COLS;
      more.appendChild(mtd);
      frag.appendChild(more);
    }
    body.replaceChildren(frag);
    if (all) mark('nftgate:services');
    setText('svc-count', (waiting || matched === all ? fmtNum(all) : fmtNum(matched) + ' of ' + fmtNum(all)) +
      ' service' + (all === 1 ? '' : 's'), 'muted');
  }

  // refreshTraffic shows new counters: in the rows drawn, in place, when
  // the order does not follow them; by a redraw when it does.
  function refreshTraffic() {
    if (!TRAFFIC) return;
    if (sortKeys[$('sort').value]) {
      renderServices();
      return;
    }
    var drawn = $('svc-body').querySelectorAll('tr[data-key]');
    for (var i = 0; i < drawn.length; i++) {
      var old = drawn[i].querySelector('td.traffic');
      if (old) drawn[i].replaceChild(trafficCell(drawn[i].dataset.key), old);
    }
    drawPanel();
  }

  function rows(id, list, cells) {
    var body = $(id);
    body.replaceChildren.apply(body, list.map(function (x) {
      var tr = el('tr');
      cells(x).forEach(function (c) { tr.appendChild(el('td', c[1] || '', c[0])); });
      return tr;
    }));
  }

  // The edge panel: BGP sessions, pools, and each Service address with
  // how it is announced. Absent (404) when the gateway has no edge.
  function renderEdge(v) {
    $('edge').hidden = false;
    $('edge-bgp').hidden = v.bgp.length === 0;
    rows('edge-bgp-body', v.bgp, function (p) {
      return [[p.address, 'mono'], [String(p.asn)], [p.state, p.state === 'established' ? 'good' : 'bad'],
        [p.since || '–'], [fmtNum(p.prefixesSent)], [fmtNum(p.prefixesReceived)], [p.bfd || '–']];
    });
    var pools = v.pools || [];
    $('edge-pools').hidden = pools.length === 0;
    rows('edge-pools-body', pools, function (p) { return [[p.pool], [fmtNum(p.used)], [fmtNum(p.free)]]; });
    var addrs = [];
    v.services.forEach(function (s) {
      s.addresses.forEach(function (a) {
        addrs.push([s.namespace + '/' + s.name, a.address, a.pool || '–',
          a.announced ? (a.via.length ? a.via.join(', ') : 'yes') : 'no: ' + a.why, a.announced ? 'good' : 'warn']);
      });
      (s.problems || []).forEach(function (p) {
        addrs.push([s.namespace + '/' + s.name, '–', '–', p.reason + ': ' + p.message, 'bad']);
      });
    });
    rows('edge-addrs-body', addrs, function (a) { return [[a[0]], [a[1], 'mono'], [a[2]], [a[3], a[4]]]; });
    var pr = v.podRoutes;
    $('edge-pods').hidden = !pr;
    rows('edge-pods-body', pr ? pr.via : [], function (r) { return [[r.via, 'mono'], [r.node || '–'], [fmtNum(r.routes)]]; });
    setText('edge-pods-summary', pr ? 'Routes to pods (' + pr.mode + '): ' + fmtNum(pr.installed) + ' of ' +
      fmtNum(pr.desired) + ' installed in table ' + pr.table + (pr.problems && pr.problems.length ?
      '; ' + pr.problems.length + ' problem' + (pr.problems.length > 1 ? 's: ' : ': ') + pr.problems.join('; ') : '') : '',
      pr && (pr.installed < pr.desired || (pr.problems && pr.problems.length)) ? 'warn' : 'muted');
    setText('edge-ipam', v.ipam ? 'Allocation: ' + (v.ipam.mode === 'lease' ?
      (v.ipam.writer ? 'this gateway writes the statuses' : 'written by ' + (v.ipam.leader || 'another gateway')) :
      'in memory (no cluster)') : '', 'muted');
  }

  // The drain: shown once one started (nftgate drain, or SIGTERM with
  // drain_on_stop); the announcements are withdrawn by then.
  function renderDrain(d) {
    $('drain').hidden = d.state === 'serving';
    if (d.state === 'serving') return;
    setText('drain-text', (d.state === 'drained' ? 'Drained; nftgate exits. ' : 'Draining since ' + d.since + ' (' + d.reason + '): ') +
      (d.withdrawn ? fmtNum(d.withdrawn.length) : '0') + ' addresses withdrawn, ' + fmtNum(d.openFlows) +
      ' open flows to them' + (d.state === 'draining' ? ', forwarded until they end or ' + d.deadline : '') + '.', 'warn');
  }

  // The gateway set: this gateway and each peer, the addresses each holds
  // (answers ARP/NDP for), and the hellos refused. Absent without one.
  function renderGateways(v) {
    $('gateways').hidden = false;
    setText('gw-mode', v.mode, 'muted');
    var list = [{name: v.name + ' (this gateway)', state: 'alive', ready: v.ready, leaving: v.leaving, faulty: !!v.fault, links: [], holds: v.holds, self: true}].concat(v.peers);
    // Readiness: holds its peers' flow state (or gave up waiting); a
    // leaving gateway drains and hands its addresses over; a faulty one
    // (a link it tracks is down) hands over what a fit one can hold.
    rows('gw-peers-body', list, function (p) {
      var ready = p.state !== 'alive' ? '–' : (p.leaving ? 'leaving' : (p.faulty ? 'faulty' : (p.ready ? 'ready' : 'not ready')));
      return [[p.name], [p.state, p.state === 'alive' ? 'good' : 'bad'],
        [ready, ready === 'ready' ? 'good' : (ready === '–' ? '' : 'warn')],
        [p.self ? '–' : (p.lastHeartbeat || 'never')],
        [p.self ? '–' : (p.links.length ? p.links.map(function (l) { return l.address; }).join(', ') : 'none'), 'mono'],
        [p.self ? '–' : fmtNum(p.channelErrors)], [p.self ? '–' : fmtNum(p.refusedHellos), p.refusedHellos ? 'warn' : ''],
        [p.holds.length ? p.holds.join(', ') : '–', 'mono']];
    });
    $('gw-refused').hidden = v.refused.length === 0;
    rows('gw-refused-body', v.refused, function (r) { return [[r.remote, 'mono'], [r.peer || '–'], [r.reason + ': ' + r.error, 'bad'], [r.time]]; });
    // Active-active: a connection picked up here in mid-stream keeps the
    // dead peer's masquerade address where this gateway holds it, or with
    // state sync where a peer does (the sync tells it the connection).
    var homes = '';
    var mh = v.midstreamHomes;
    if (mh && mh.addresses.length) {
      var held = mh.held || [];
      var where = held.length === mh.addresses.length ? 'held here' :
        (held.length ? held.join(', ') + ' held here, the others by peers, which the state sync tells' :
          'held by peers, which the state sync tells');
      homes = ' Connections picked up in mid-stream are masqueraded to ' + mh.dead + '\'s ' +
        mh.addresses.join(', ') + ' (dead, ' + where + ').';
    }
    // The wait for a replica, shorter while a peer is dead.
    var mw = v.midstreamTCPWait;
    if (mw && mw.peersDead.length) {
      homes += ' Connections picked up in mid-stream wait ' + mw.wait + ' for their replicas while ' +
        mw.peersDead.join(', ') + (mw.peersDead.length > 1 ? ' are' : ' is') + ' dead.';
    }
    // A tracked link down: what a fit peer can hold is handed over.
    var fault = v.fault ? ' Faulty (' + v.fault + ')' + (v.standby ? ': on standby while a fit peer carries the traffic.' : '.') : '';
    setText('gw-summary', 'Set ' + v.setHash + ': ' + fmtNum(v.holds.length) + ' of ' + fmtNum(v.serves) +
      ' served addresses held here; taken ' + fmtNum(v.taken) + ', taken over ' + fmtNum(v.takenOver) + ', released ' + fmtNum(v.released) + '.' + fault + homes,
      v.fault ? 'warn' : 'muted');
  }

  // The connection-state sync: per peer, what waits, what went each way,
  // what was refused (by reason) or lost, the resyncs and the last lag.
  function renderStateSync(v) {
    $('statesync').hidden = false;
    rows('ss-peers-body', v.peers, function (p) {
      var refused = Object.keys(p.refused || {}).map(function (r) { return r + ' ' + fmtNum(p.refused[r]); }).join(', ');
      return [[p.name], [!p.up ? 'down' : (p.resyncing ? 'resyncing' : 'in sync'), !p.up ? 'bad' : (p.resyncing ? 'warn' : 'good')],
        [fmtNum(p.queue)], [fmtNum(p.sent)], [fmtNum(p.received)], [refused || '0', refused ? 'warn' : ''],
        [fmtNum(p.lost), p.lost ? 'warn' : ''], [fmtNum(p.resyncsSent) + ' / ' + fmtNum(p.resyncsReceived)],
        [p.lagSeconds ? (p.lagSeconds * 1000).toFixed(1) + ' ms' : '–']];
    });
    setText('ss-summary', (v.ready ? 'Ready: ' : 'Waiting for the peers\' resyncs: ') + fmtNum(v.flows) + ' own entries, ' +
      fmtNum(v.replicas) + ' replicas of the peers\', ' + fmtNum(v.adopted) + ' adopted from dead peers, kernel event losses ' +
      fmtNum(v.eventsLost) + '; not replicated (no failover for them): ' + (Object.keys(v.notReplicated || {}).filter(function (r) {
        return v.notReplicated[r];
      }).map(function (r) { return r.replace(/_/g, ' ') + ' ' + fmtNum(v.notReplicated[r]); }).join(', ') || 'none') + '.' +
      (v.conntrackEvents ? ' Conntrack events: ' + v.conntrackEvents + '.' : ''),
      v.ready ? 'muted' : 'warn');
  }

  function setLive(ok, why) {
    var live = $('live');
    live.className = ok ? 'live' : 'live stale';
    setText('live-text', ok ? 'live' : 'no answer from the gateway' + (why ? ' (' + why + ')' : ''));
  }

  function keep(list) {
    list.services.forEach(function (s) { s._text = searchText(s); });
    services = list.services;
  }

  // loadServices fetches the whole Service list. The first time, the
  // first rows by name come beside it in a small answer of their own, and
  // are drawn while the whole list is on its way.
  function loadServices(first) {
    if (first) {
      getJSON('api/v1/services?limit=' + MAX_ROWS).then(function (list) {
        if (servicesRevision !== null) return; // the whole list came first
        mark('nftgate:services-head-json');
        keep(list);
        headTotal = list.total;
        renderServices();
      }, function () {}); // the whole list's request tells of failures
    }
    return getJSON('api/v1/services').then(function (list) {
      mark('nftgate:services-json');
      keep(list);
      headTotal = null;
      servicesRevision = list.revision;
      renderServices();
    });
  }

  // tick asks for everything at once; the Service list, the largest
  // answer, only when its revision changed since the last one, which the
  // status tells. The first tick asks for it beside the status, not after.
  function tick() {
    var first = servicesRevision === null;
    var listed = first ? loadServices(true) : null;
    var redraw = false;
    var jobs = [getJSON('api/v1/status').then(function (st) {
      mark('nftgate:status-json');
      renderStatus(st);
      if (!first && st.sync.servicesRevision !== servicesRevision) listed = loadServices(false);
      return listed;
    }), getJSON('api/v1/syncs').then(renderCharts)];
    if ($('edge').dataset.edge) jobs.push(getJSON('api/v1/edge').then(renderEdge));
    if ($('drain').dataset.drain) jobs.push(getJSON('api/v1/drain').then(renderDrain));
    if ($('gateways').dataset.gateways) jobs.push(getJSON('api/v1/gateways').then(renderGateways));
    if ($('statesync').dataset.statesync) jobs.push(getJSON('api/v1/statesync').then(renderStateSync));
    if (TRAFFIC) {
      jobs.push(getJSON('api/v1/traffic?sort=name').then(function (v) {
        mark('nftgate:traffic-json');
        if (v.readAt !== trafficAt) { setTraffic(v); redraw = true; }
      }));
    }
    if (HISTORY && Date.now() - histFetched >= Math.max(histStep * 1000, REFRESH)) {
      jobs.push(getJSON('api/v1/traffic/history').then(function (v) { histFetched = Date.now(); setHistory(v); redraw = true; }));
    }
    if (EVENTS) {
      var kind = $('event-kind').value;
      jobs.push(getJSON('api/v1/events?limit=100' + (kind ? '&kind=' + kind : '')).then(renderEvents));
    }
    if (detail) jobs.push(loadFlows());
    Promise.all(jobs).then(function () {
      // The table follows the counters only when the list did not just
      // redraw it.
      if (redraw && !listed && services.length) refreshTraffic();
    }).then(function () {
      setLive(true);
      document.body.dataset.loaded = 'true';
    }, function (err) {
      setLive(false, err && err.message);
    }).then(function () {
      setTimeout(tick, REFRESH);
    });
  }

  // A filter redraws at the next frame (typing faster than frames
  // coalesces), and its time, from the keystroke until the frame after the
  // redraw is painted, is kept as a performance measure.
  var pending = 0, since = 0;
  function onFilter(e) {
    if (!since) since = e.timeStamp;
    if (pending) return;
    pending = requestAnimationFrame(function () {
      pending = 0;
      var start = since;
      since = 0;
      var t0 = performance.now();
      renderServices();
      performance.measure('nftgate:filter-render', { start: t0, end: performance.now() });
      requestAnimationFrame(function () {
        setTimeout(function () { performance.measure('nftgate:filter', { start: start, end: performance.now() }); }, 0);
      });
    });
  }
  $('search').addEventListener('input', onFilter);
  $('type-filter').addEventListener('change', renderServices);
  $('sort').addEventListener('change', renderServices);
  $('event-kind').addEventListener('change', function () {
    getJSON('api/v1/events?limit=100' + ($('event-kind').value ? '&kind=' + $('event-kind').value : '')).then(renderEvents);
  });
  $('problems').addEventListener('change', renderServices);
  document.addEventListener('keydown', function (e) {
    if (e.key === '/' && document.activeElement !== $('search')) { e.preventDefault(); $('search').focus(); }
  });
  tick();
})();
