"""The review pages: server-rendered HTML (Jinja2, autoescaped: a note or a correction is shown as
text, never run), one route module for the pages and one for their form posts' parsing."""
