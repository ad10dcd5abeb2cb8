"""A package's README as HTML that is safe to put on a hub page.

A README is written by whoever published the package: untrusted input. Markdown (the default, and what
``Description-Content-Type: text/markdown`` says) is rendered by markdown-it-py with raw HTML allowed, as
READMEs use it, and the result always passes through nh3 (the Ammonia sanitizer): only its allowlisted tags and
attributes survive, never a ``<script>``, ``<style>``, ``<iframe>``, ``<form>``, an event handler or a style, and
links keep only ``http``, ``https`` and ``mailto`` URLs. Any other content type is shown as preformatted text, and
so is a README longer than ``MAX_MARKDOWN_CHARS`` (markdown-it-py takes about a second per 100,000 characters, and a
page must not cost more than that; the wheel's 1 MB metadata limit bounds the text itself).
"""

from __future__ import annotations

import functools

import nh3
from markdown_it import MarkdownIt
from markupsafe import Markup, escape

URL_SCHEMES = {"http", "https", "mailto"}
MAX_MARKDOWN_CHARS = 100_000
_markdown = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])


@functools.lru_cache(maxsize=64)
def render(text: str, content_type: str | None) -> Markup:
    """The sanitized HTML of a README.

    Args:
        text: the README as published (its wheel's METADATA description).
        content_type: its ``Description-Content-Type``; ``None`` or ``text/markdown`` renders Markdown.

    Returns:
        HTML that Jinja2 inserts as is: it holds nothing the sanitizer did not allow.
    """
    kind = (content_type or "text/markdown").split(";", 1)[0].strip().lower()
    if kind == "text/markdown" and len(text) <= MAX_MARKDOWN_CHARS:
        html = _markdown.render(text)
    else:
        html = f"<pre>{escape(text)}</pre>"
    return Markup(nh3.clean(html, url_schemes=URL_SCHEMES, link_rel="nofollow noopener noreferrer"))
