"""`benchfarm web`: a live, read-only dashboard of the store (boards, queue, jobs' progress,
experiments) as HTML pages and a JSON API; ``views.py`` holds what it shows,
``data.py`` reads it, ``app.py`` serves it."""
