#!/usr/bin/env python3
"""An SMTP server for the provider tests, built on aiosmtpd (pip install aiosmtpd).

    python3 tests/smtp_server.py PORT MAIL_DIR [starttls|implicit CERT KEY | busy]

With starttls it offers STARTTLS with CERT and KEY (PEM); with implicit it speaks TLS
from the first byte (smtps). With busy it takes every session and refuses every mail
for now (451 to MAIL FROM), as a relay that throttles: sends reach it and fail.

Listens on 127.0.0.1:PORT (0 picks a free port) and prints "READY <port>" once it
accepts connections. It answers each RCPT by the local part of the address:

    anything+450@...  ->  450 4.2.0 mailbox busy
    anything+550@...  ->  550 5.1.1 no such user
    anything+421@...  ->  421 4.3.2 shutting down
    anything+slow@... ->  250 OK, half a second late
    anything else     ->  250 OK

and each MAIL FROM by the sender's local part: +530 -> 530 5.7.0 authentication
required, +554 -> 554 5.7.1 relaying denied. A recipient +451once@... makes the end of
DATA answer 451 the first time that address is seen (the mail is not stored; its
Message-ID is appended to MAIL_DIR/refused.log), and 250 after.

Each accepted mail is stored as MAIL_DIR/<n>.eml (written to a temporary name and then
renamed, so a reader never sees half a mail), numbered on from the mails already in
MAIL_DIR, so a server started again on the same directory keeps what the last one
stored. Each EHLO or HELO, that is each SMTP session, appends a line to
MAIL_DIR/sessions.log, so tests can count connections.
Exits on SIGTERM or SIGINT.
"""

import asyncio
import itertools
import os
import signal
import ssl
import sys
import threading

from aiosmtpd.controller import Controller


class Handler:
    def __init__(self, mail_dir, busy=False):
        self.mail_dir = mail_dir
        self.busy = busy
        # After the mails a server before this one stored in MAIL_DIR, if any.
        stored = [int(name[:-4]) for name in os.listdir(mail_dir)
                  if name.endswith(".eml") and name[:-4].isdigit()]
        self.numbers = itertools.count(max(stored, default=0) + 1)
        self.refused_once = set()

    def _log_session(self, hostname):
        with open(os.path.join(self.mail_dir, "sessions.log"), "a") as log:
            log.write(f"{hostname}\n")

    async def handle_EHLO(self, server, session, envelope, hostname, responses):
        session.host_name = hostname
        self._log_session(hostname)
        return responses

    async def handle_HELO(self, server, session, envelope, hostname):
        session.host_name = hostname
        self._log_session(hostname)
        return f"250 {server.hostname}"

    async def handle_MAIL(self, server, session, envelope, address, mail_options):
        local_part = address.rsplit("@", 1)[0]
        if self.busy:
            return "451 4.3.2 not accepting mail for now"
        if local_part.endswith("+530"):
            return "530 5.7.0 Authentication required"
        if local_part.endswith("+554"):
            return "554 5.7.1 Relaying denied"
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 OK"

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        local_part = address.rsplit("@", 1)[0]
        if local_part.endswith("+421"):
            return "421 4.3.2 shutting down"
        if local_part.endswith("+450"):
            return "450 4.2.0 mailbox busy"
        if local_part.endswith("+550"):
            return "550 5.1.1 no such user"
        if local_part.endswith("+slow"):
            await asyncio.sleep(0.5)
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        once = [a for a in envelope.rcpt_tos if a.rsplit("@", 1)[0].endswith("+451once")]
        if once and once[0] not in self.refused_once:
            self.refused_once.add(once[0])
            message_id = next(
                (line.split(":", 1)[1].strip() for line in
                 envelope.original_content.decode("utf-8", "replace").splitlines()
                 if line.lower().startswith("message-id:")), "")
            with open(os.path.join(self.mail_dir, "refused.log"), "a") as log:
                log.write(f"{message_id}\n")
            return "451 4.3.0 try again later"
        number = next(self.numbers)
        final = os.path.join(self.mail_dir, f"{number}.eml")
        temporary = os.path.join(self.mail_dir, f".{number}.tmp")
        with open(temporary, "wb") as mail:
            mail.write(envelope.original_content)
        os.rename(temporary, final)
        return "250 2.0.0 stored"


class AnyPortController(Controller):
    """A Controller that may listen on port 0: it learns the port the system chose
    before aiosmtpd connects to itself to check that it is up."""

    def _trigger_server(self):
        if self.port == 0 and self.server is not None:
            self.port = self.server.sockets[0].getsockname()[1]
        super()._trigger_server()


def main():
    if len(sys.argv) not in (3, 4, 6) or sys.argv[3:4] not in ([], ["busy"]) and len(sys.argv) == 4:
        sys.exit("usage: smtp_server.py PORT MAIL_DIR [starttls|implicit CERT KEY | busy]")
    port, mail_dir = int(sys.argv[1]), sys.argv[2]
    os.makedirs(mail_dir, exist_ok=True)
    tls = {}
    if len(sys.argv) == 6:
        mode, cert, key = sys.argv[3:]
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        tls = {"tls_context": context} if mode == "starttls" else {"ssl_context": context}

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    handler = Handler(mail_dir, busy=sys.argv[3:] == ["busy"])
    controller = AnyPortController(handler, hostname="127.0.0.1", port=port, **tls)
    controller.start()
    print(f"READY {controller.port}", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        controller.stop()


if __name__ == "__main__":
    main()
