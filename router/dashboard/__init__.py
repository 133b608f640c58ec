"""The dashboard under /ui/: cost, savings, quality, latency, keys and eval curves in the browser.

Read-only pages for admin and report keys (`router.api.routes_ui`). Every figure is made by the
report code the command line uses (`router.reports.costs`, `router.reports.quality`), over the
same ledger rows, so a page and `tierroute report costs` / `report quality` agree (`figures`);
the Evals page reads a committed eval report's sweep (`evals`). The pages themselves are static
files (`static/`): one HTML page, one script and one style sheet, served with a Content-Security-
Policy that allows nothing but them and the JSON they fetch. The script builds every table and
chart with DOM calls that take text as text (`textContent`, SVG `<text>` nodes), never markup,
so a key, team, model or task name cannot become a tag.
"""
