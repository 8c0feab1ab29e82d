// dcpi flame graph: hover for details, click a frame to zoom, "Reset Zoom" to go back,
// "Search" or Ctrl-F for a regular expression (matches turn magenta, their share is shown),
// Escape clears the search, ?s=REGEX searches at load.
function dcpiFlame(svg) {
  if (!svg) return;
  var W = +svg.getAttribute('data-width'), pad = +svg.getAttribute('data-pad');
  var charW = +svg.getAttribute('data-charw');
  var total = +svg.getAttribute('data-total'), unit = svg.getAttribute('data-unit');
  var details = svg.querySelector('.details'), matched = svg.querySelector('.matched');
  var reset = svg.querySelector('.reset'), searchBtn = svg.querySelector('.search');
  var frames = Array.prototype.map.call(svg.querySelectorAll('g.f'), function (g) {
    var r = g.querySelector('rect');
    return { g: g, r: r, t: g.querySelector('text'), n: g.getAttribute('data-n'),
      x: +g.getAttribute('data-x'), w: +g.getAttribute('data-w'), d: +g.getAttribute('data-d'),
      fill: r.getAttribute('fill') };
  });
  var zx = 0, zw = total, zd = 0, re = null;
  function pct(v) { return total > 0 ? (100 * v / total).toFixed(2) + '%' : '0%'; }
  function fit(f, px) {
    var n = Math.floor((px - 6) / charW), s = f.n, slash = s.lastIndexOf('/');
    // An image frame too narrow for its path shows the file name first.
    if (s.length > n && f.d === 1 && slash >= 0) s = s.slice(slash + 1);
    f.t.textContent = n < 3 ? '' : (s.length <= n ? s : s.slice(0, n - 2) + '..');
  }
  function layout() {
    var sc = zw > 0 ? (W - 2 * pad) / zw : 0;
    frames.forEach(function (f) {
      var inside = f.x >= zx && f.x + f.w <= zx + zw && f.d >= zd;
      var below = f.d < zd && f.x <= zx && f.x + f.w >= zx + zw;
      var lo = Math.max(f.x, zx), hi = Math.min(f.x + f.w, zx + zw), px = (hi - lo) * sc;
      if (!(inside || below) || px < 0.1) { f.g.style.display = 'none'; return; }
      f.g.style.display = '';
      var x = pad + (lo - zx) * sc;
      f.r.setAttribute('x', x.toFixed(2));
      f.r.setAttribute('width', px.toFixed(2));
      f.t.setAttribute('x', (x + 3).toFixed(2));
      if (below) f.g.classList.add('anc'); else f.g.classList.remove('anc');
      fit(f, px);
    });
    reset.setAttribute('opacity', zw < total || zd > 0 ? '1' : '0.3');
  }
  function search(r) {
    re = r;
    var hits = [];
    frames.forEach(function (f) {
      var m = !!(re && re.test(f.n));
      f.r.setAttribute('fill', m ? 'rgb(230,0,230)' : f.fill);
      if (m) hits.push([f.x, f.x + f.w]);
    });
    // Nested matches cover the same samples: count the union of their extents.
    hits.sort(function (a, b) { return a[0] - b[0]; });
    var sum = 0, end = -1;
    hits.forEach(function (h) {
      if (h[0] >= end) { sum += h[1] - h[0]; end = h[1]; }
      else if (h[1] > end) { sum += h[1] - end; end = h[1]; }
    });
    matched.textContent = re ? 'Matched: ' + pct(sum) : '';
    searchBtn.textContent = re ? 'Clear' : 'Search';
  }
  function ask() {
    if (re) { search(null); return; }
    var t = window.prompt('Search (regular expression):', '');
    if (!t) return;
    try { search(new RegExp(t)); } catch (e) { matched.textContent = 'bad expression: ' + e.message; }
  }
  frames.forEach(function (f) {
    f.g.addEventListener('click', function () { zx = f.x; zw = f.w; zd = f.d; layout(); });
    f.g.addEventListener('mouseover', function () {
      details.textContent = f.n + ' (' + f.w + ' ' + unit + ', ' + pct(f.w) + ')';
    });
    f.g.addEventListener('mouseout', function () { details.textContent = ' '; });
  });
  reset.addEventListener('click', function () { zx = 0; zw = total; zd = 0; layout(); });
  searchBtn.addEventListener('click', ask);
  document.addEventListener('keydown', function (e) {
    if ((e.ctrlKey || e.metaKey) && e.key === 'f') { e.preventDefault(); ask(); }
    else if (e.key === 'Escape') search(null);
  });
  try {
    var q = new URLSearchParams(window.location.search).get('s');
    if (q) search(new RegExp(q));
  } catch (e) { /* no usable query: no initial search */ }
  layout();
  svg.setAttribute('data-ready', '1');
}
