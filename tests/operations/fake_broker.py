"""A stand-in for a local broker's ports, for tests/operations/demo.rs (which runs `make
demo` with fake rabbitmq-server and rabbitmq-plugins that start it): `amqp PORT` accepts
and closes connections; `http PORT` answers GET /api/overview as a management API does,
and 404 to everything else."""
import http.server
import socket
import sys

mode, port = sys.argv[1], int(sys.argv[2])
if mode == "amqp":
    server = socket.create_server(("127.0.0.1", port))
    while True:
        connection, _ = server.accept()
        connection.close()
else:
    class Handler(http.server.BaseHTTPRequestHandler):
        def answer(self):
            found = self.path.startswith("/api/overview")
            body = b'{"rabbitmq_version":"0.0.0-fake"}' if found else b'{"error":"not_found","reason":"a fake broker"}'
            self.send_response(200 if found else 404)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PUT = do_DELETE = do_POST = answer

        def log_message(self, *args):
            pass

    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
