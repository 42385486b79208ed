"""The page `specli serve` shows at `/`: a chat (or, for a base model, a completion box) whose
answer streams in with every token's provenance in colour, beside live acceptance and speed.

Four files shipped in the package (`static/`): HTML, CSS and plain JavaScript (the page, and
the Markdown it shows a chat's answers in), with no build step and nothing fetched from
another host. The page calls the same API as any client, with the key it asks for when the
server has one. Model output is put in the page as text only,
and the Content-Security-Policy allows scripts, styles and requests from this origin alone (images
also as data: URLs: the ones a reader attaches, read in the page).
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI, Response

# Only this origin's own files and API: no inline script or style, no frames, no forms posted.
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                           "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
ASSETS = {  # route: (file in static/, media type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/page.css": ("page.css", "text/css; charset=utf-8"),
    "/markdown.js": ("markdown.js", "text/javascript; charset=utf-8"),
    "/page.js": ("page.js", "text/javascript; charset=utf-8"),
}


def add_page(app: FastAPI) -> None:
    """GET /, /page.css, /markdown.js and /page.js, read once from the package; no key needed to load them."""
    static = files("specli.serve").joinpath("static")
    for route, (name, media_type) in ASSETS.items():
        app.add_api_route(route, _serve(static.joinpath(name).read_bytes(), media_type), methods=["GET", "HEAD"],
                          include_in_schema=False)

    async def no_icon() -> Response:  # browsers ask for one; answer without a 404 in the log
        return Response(status_code=204, headers=HEADERS)

    app.add_api_route("/favicon.ico", no_icon, methods=["GET", "HEAD"], include_in_schema=False)


def _serve(body: bytes, media_type: str):
    async def asset() -> Response:
        return Response(body, media_type=media_type, headers=HEADERS)

    return asset
