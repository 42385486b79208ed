"""`specli serve`: the engine behind an OpenAI-compatible HTTP API and a web page.

- server.py: loads the pair and runs uvicorn until SIGINT or SIGTERM;
- app.py: the routes and their wiring; errors.py: every error in OpenAI's shape, from one table;
- requests.py and responses.py: the bodies read and written;
- generation.py: a body as a generation (its constraint written once); answer.py: a generation
  answered whole, sse.py: or streamed as server-sent events; log.py: one line per request;
- worker.py: one generation at a time, the others queued; page.py: the page at `/`.
"""
