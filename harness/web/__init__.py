"""`benchfarm web`: a live, read-only dashboard of the store (boards, queue, jobs' progress,
experiments) as HTML pages and a JSON API; ``data.py`` reads, ``app.py`` serves."""
