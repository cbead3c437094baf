"""moto's AWS services in server mode, as `python -m moto.server` serves them, but keeping
connections open between requests (HTTP/1.1 keep-alive), as S3 does.

`python -m moto.server` runs on werkzeug's development server, which answers every request
with `Connection: close`: each S3 request of the gateway then opened a new TCP connection
(a socket, `getaddrinfo`, connect and close in its worker thread), CPU that a client of S3
does not spend. Here uvicorn serves moto's WSGI application (through its WSGI middleware).
Run as `python bench/s3_server.py HOST PORT`.
"""

from __future__ import annotations

import os
import sys

import uvicorn
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from uvicorn.middleware.wsgi import WSGIMiddleware


def main(argv: list[str]) -> int:
    host, port = argv[0], int(argv[1])
    os.environ.setdefault("MOTO_PORT", str(port))  # as `python -m moto.server` sets it
    app = WSGIMiddleware(DomainDispatcherApplication(create_backend_app), workers=4)
    uvicorn.run(app, host=host, port=port, http="httptools", log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
