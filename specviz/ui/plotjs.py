"""Browser-side care for plotly charts that gradio leaves behind.

gradio draws a fresh plot element on every update of a gr.Plot and drops the old one without
`Plotly.purge`, so plotly's window resize handler keeps the old element and its SVG alive for as long as
the tab stays open (a class's whole lesson). PURGE_PLOTS_JS purges a plot once it has left the page for good.
"""
from __future__ import annotations

PURGE_PLOTS_JS = """() => {
  if (window.__svPlotsPurged) { return; }
  window.__svPlotsPurged = true;
  const gone = new Set();
  // a second later, not at once: an element moved within the page is removed and added back meanwhile
  const purge = () => {
    for (const gd of gone) { if (!gd.isConnected && window.Plotly) { window.Plotly.purge(gd); } }
    gone.clear();
  };
  new MutationObserver((changes) => {
    let any = false;
    for (const c of changes) {
      for (const n of c.removedNodes) {
        if (n.nodeType !== 1) { continue; }
        const plots = n.classList.contains('js-plotly-plot') ? [n] : n.querySelectorAll('.js-plotly-plot');
        for (const gd of plots) { gone.add(gd); any = true; }
      }
    }
    if (any) { setTimeout(purge, 1000); }
  }).observe(document.body, {subtree: true, childList: true});
}"""
