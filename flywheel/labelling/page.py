"""The labelling page: a WSGI app that shows the logged images worth labelling, one at a
time or as a grid, and records a person's decisions in a store.Store.

Plain HTML forms do the work (a decision is a POST, answered by a redirect to the next
images), so the page works without JavaScript; /app.js only adds keys: 1-9 then letters
for the classes, `n` none of these, `s` skip, arrows to move between images.

Everything on it came from a log, a model or a folder and is treated as hostile:
- texts (class and model names, request ids, reasons, labeller names) are HTML-escaped
  wherever they are written, attributes included;
- images are only ever the PNG thumbnails items.py made, served as image/png;
- every answer carries `X-Content-Type-Options: nosniff` and a Content-Security-Policy
  that allows only this server's own script, style, images and forms (no inline script:
  even an unescaped `<script>` could not run), and no framing;
- a decision needs the session's secret token (a SameSite=Strict, HttpOnly cookie and a
  form field that must match it), so another site cannot post labels through a browser;
- request bodies are bounded (MAX_BODY_BYTES) and parsed as forms only; with
  `allowed_hosts`, requests naming another Host (DNS rebinding) are refused.

Each browser is a session: it claims the images it is shown (store.py claims), so two
labellers see different images; a decision on an image someone else decided first is
answered 409 with who labelled it and how. Only a browser that keeps the session cookie
and asks for the page claims anything: a GET without the cookie is redirected to the page
with the cookie set (a fresh session token, signed by this page, so no session is stored
for a client that never comes back with it), and if it comes back without it (a health
checker, a link preview, a browser without cookies) it gets a page that holds no image;
a HEAD request never claims. Otherwise every probe would hold images for --claim_seconds
and lock the real labellers out.
"""
import collections
import hashlib
import hmac
import html
import logging
import re
import secrets
import threading
import time
import unicodedata
import urllib.parse

from slimserve import errors
from slimserve.flywheel.labelling import items as items_lib
from slimserve.flywheel.labelling import store as store_lib

MAX_BODY_BYTES = 16 * 1024
MAX_FORM_FIELDS = 16
MAX_SESSIONS = 256
MAX_LABELLER_CHARS = 64
DEFAULT_GRID_SIZE = 6
DEFAULT_CLAIM_SECONDS = 600.0
COOKIE = "slimserve_label"
NAME_COOKIE = "slimserve_labeller"  # the name a browser chose, kept across restarts
# Keys for classes 0.. in order: digits first, then letters other than n and s.
CLASS_KEYS = "123456789" + "".join(c for c in "abcdefghijklmopqrtuvwxyz")
NONE_KEY, SKIP_KEY = "n", "s"
_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}$")
_STATUS = {200: "OK", 303: "See Other", 400: "Bad Request", 403: "Forbidden",
           404: "Not Found", 405: "Method Not Allowed", 409: "Conflict", 410: "Gone",
           413: "Payload Too Large", 415: "Unsupported Media Type", 421: "Misdirected Request",
           500: "Internal Server Error", 507: "Insufficient Storage"}
SECURITY_HEADERS = [
    ("Content-Security-Policy", "default-src 'none'; img-src 'self'; style-src 'self'; "
     "script-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("Cross-Origin-Opener-Policy", "same-origin"),
    ("Cross-Origin-Resource-Policy", "same-origin"),
]

SCRIPT = r"""(function () {
  "use strict";
  var cards = Array.prototype.slice.call(document.querySelectorAll(".card"));
  if (!cards.length) { return; }
  var focus = parseInt(document.body.getAttribute("data-focus") || "0", 10);
  var sent = false;
  if (!(focus >= 0 && focus < cards.length)) { focus = 0; }
  function show(index) {
    cards.forEach(function (card, i) { card.classList.toggle("focused", i === index); });
    focus = index;
    cards[index].scrollIntoView({block: "nearest"});
  }
  show(focus);
  cards.forEach(function (card, i) {
    card.addEventListener("click", function () { if (focus !== i) { show(i); } });
  });
  document.querySelectorAll("form.decide").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (sent) { event.preventDefault(); } sent = true;
    });
  });
  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || sent) { return; }
    var tag = event.target && event.target.tagName;
    if (tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT") { return; }
    if (event.key === "ArrowRight" || event.key === "ArrowDown") {
      event.preventDefault(); show((focus + 1) % cards.length); return;
    }
    if (event.key === "ArrowLeft" || event.key === "ArrowUp") {
      event.preventDefault(); show((focus + cards.length - 1) % cards.length); return;
    }
    if (!event.key || event.key.length !== 1) { return; }
    var key = event.key.toLowerCase();
    var buttons = cards[focus].querySelectorAll("button[data-key]");
    for (var i = 0; i < buttons.length; i++) {
      if (buttons[i].getAttribute("data-key") === key) {
        event.preventDefault(); buttons[i].click(); return;
      }
    }
  });
})();
"""

STYLE = """body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#f4f4f2;color:#222}
header,#legend,#message,main,footer{margin:0 16px}
header{display:flex;flex-wrap:wrap;gap:16px;align-items:baseline;padding:10px 0}
header h1{font-size:18px;margin:0}
#message{padding:8px 12px;background:#fff3cd;border:1px solid #e0c060;border-radius:4px}
#message.error{background:#fde2e1;border-color:#d08080}
#legend{display:flex;flex-wrap:wrap;gap:8px;padding:6px 0}
.class{background:#fff;border:1px solid #ccc;border-radius:4px;padding:4px 6px}
.class img,.top img{width:32px;height:32px;image-rendering:pixelated;border:1px solid #ddd}
kbd{font:12px monospace;background:#eee;border:1px solid #bbb;border-radius:3px;padding:0 4px}
main{display:flex;flex-wrap:wrap;gap:12px;padding:8px 0}
.card{background:#fff;border:2px solid #ccc;border-radius:6px;padding:8px;width:340px}
.card.focused{border-color:#2a6fdb;box-shadow:0 0 0 2px #2a6fdb55}
.single .card{display:none}.single .card.focused{display:block;width:520px}
.shot{width:192px;height:192px;object-fit:contain;image-rendering:pixelated;background:#000}
.single .shot{width:320px;height:320px}
.meta{color:#666;font-size:12px;word-break:break-all}
.top{margin:6px 0;padding-left:20px}
.decide button{margin:2px;padding:4px 8px;cursor:pointer}
.decide .other{background:#eee}
footer{color:#666;font-size:12px;padding:12px 0}
"""


# Host headers a browser sends for a page that listens on a loopback address.
_LOOPBACK = {"127.0.0.1": ("127.0.0.1", "localhost"), "localhost": ("127.0.0.1", "localhost"),
             "::1": ("[::1]", "localhost")}


def allowed_hosts(host, port):
    """The Host headers to accept for a page listening on host:port: its loopback names
    (a DNS-rebinding site names its own host and is refused), or None (any) when it
    listens elsewhere."""
    names = _LOOPBACK.get(host)
    return None if names is None else {"%s:%d" % (name, port) for name in names}


NEW_SESSION = "cookie"  # the query parameter of the redirect that set the cookie


class _Session:
    def __init__(self, labeller, token):
        self.token = token  # secret: cookie and form field
        self.id = secrets.token_hex(8)  # public: claims and provenance name it
        self.labeller = labeller
        self.seen = time.monotonic()


def _clean_name(text):
    """A labeller name as typed: controls dropped, whitespace folded, bounded."""
    text = "".join(c for c in text if unicodedata.category(c)[0] != "C")
    return " ".join(text.split())[:MAX_LABELLER_CHARS]


def _e(value):
    return html.escape(str(value), quote=True)


def _utc(seconds):
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(seconds)) if seconds else "?"


class LabelPage:
    """The WSGI app. items: [items.Item], best first; classes: names by index;
    examples: {class index: [PNG]}; labeller: the default name of a new session."""

    def __init__(self, items, classes, store, examples=None, labeller="unknown",
                 grid_size=DEFAULT_GRID_SIZE, claim_seconds=DEFAULT_CLAIM_SECONDS,
                 view="single", allowed_hosts=None, notes=()):
        self.items = collections.OrderedDict((item.request_id, item) for item in items)
        self.classes = list(classes)
        self.store = store
        self.examples = examples or {}
        self.labeller = _clean_name(labeller) or "unknown"
        self.grid_size = grid_size
        self.claim_seconds = claim_seconds
        self.view = view
        self.allowed_hosts = {h.lower() for h in allowed_hosts} if allowed_hosts else None
        self.notes = list(notes)  # lines for the footer (what was read, what was skipped)
        self._sessions = collections.OrderedDict()
        self._lock = threading.Lock()
        self._secret = secrets.token_bytes(32)  # signs the session tokens this page issued

    # --- WSGI ----------------------------------------------------------------------

    def __call__(self, environ, start_response):
        try:
            status, headers, body = self._route(environ)
        except Exception:  # pylint: disable=broad-except  (one request, never the server)
            logging.exception("labelling page: %s %s failed", environ.get("REQUEST_METHOD"),
                              environ.get("PATH_INFO"))
            status, headers, body = self._text(500, "internal error; see the server log")
        start_response("%d %s" % (status, _STATUS.get(status, "Error")),
                       headers + SECURITY_HEADERS + [("Content-Length", str(len(body)))])
        return [body]

    def _route(self, environ):
        if self.allowed_hosts is not None and \
                environ.get("HTTP_HOST", "").lower() not in self.allowed_hosts:
            return self._text(421, "this page answers only to %s"
                              % ", ".join(sorted(self.allowed_hosts)))
        method = environ.get("REQUEST_METHOD", "GET")
        path = environ.get("PATH_INFO", "/")
        if path == "/":
            if method == "HEAD":  # a probe: the page's headers, no session, no claim
                return 200, [("Content-Type", "text/html; charset=utf-8"),
                             ("Cache-Control", "no-store")], b""
            if method == "GET":
                return self._index(environ)
            return self._text(405, "GET only")
        if path in ("/decide", "/labeller"):
            if method != "POST":
                return self._text(405, "POST only")
            form, refusal = self._form(environ)
            if refusal:
                return refusal
            session = self._session(environ)
            if session is None or not hmac.compare_digest(
                    form.get("token", ""), session.token):
                return self._text(403, "this page's session has expired; reload it")
            if path == "/labeller":
                session.labeller = _clean_name(form.get("name", "")) or session.labeller
                status, headers, body = self._redirect(form)
                headers.append(("Set-Cookie", "%s=%s; SameSite=Strict; Path=/; Max-Age=%d" % (
                    NAME_COOKIE, urllib.parse.quote(session.labeller, safe=""),
                    365 * 86400)))
                return status, headers, body
            return self._decide(session, form)
        if method not in ("GET", "HEAD"):
            return self._text(405, "GET only")
        if path == "/app.js":
            return 200, [("Content-Type", "text/javascript; charset=utf-8"),
                         ("Cache-Control", "no-cache")], SCRIPT.encode()
        if path == "/app.css":
            return 200, [("Content-Type", "text/css; charset=utf-8"),
                         ("Cache-Control", "no-cache")], STYLE.encode()
        match = re.match(r"^/image/([A-Za-z0-9_.-]{1,200})\.png$", path)
        if match and match.group(1) in self.items:
            return self._png(self.items[match.group(1)].thumbnail)
        match = re.match(r"^/example/(\d{1,6})/(\d{1,3})\.png$", path)
        if match:
            shown = self.examples.get(int(match.group(1)), [])
            if int(match.group(2)) < len(shown):
                return self._png(shown[int(match.group(2))])
        return self._text(404, "not found")

    @staticmethod
    def _text(status, message):
        return status, [("Content-Type", "text/plain; charset=utf-8"),
                        ("Cache-Control", "no-store")], (message + "\n").encode()

    @staticmethod
    def _png(data):
        return 200, [("Content-Type", "image/png"),
                     ("Cache-Control", "private, max-age=3600")], data

    def _form(self, environ):
        """(fields, None) of a bounded urlencoded body, or (None, refusal)."""
        kind = environ.get("CONTENT_TYPE", "").split(";")[0].strip().lower()
        if kind != "application/x-www-form-urlencoded":
            return None, self._text(415, "expected a form (application/x-www-form-urlencoded)")
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return None, self._text(400, "bad Content-Length")
        if length < 0 or length > MAX_BODY_BYTES:
            return None, self._text(413, "a form is at most %d bytes" % MAX_BODY_BYTES)
        body = environ["wsgi.input"].read(length) if length else b""
        try:
            pairs = urllib.parse.parse_qsl(body.decode("utf-8"), keep_blank_values=True,
                                           strict_parsing=False,
                                           max_num_fields=MAX_FORM_FIELDS)
        except (UnicodeDecodeError, ValueError):
            return None, self._text(400, "malformed form")
        return dict(pairs), None

    # --- sessions ------------------------------------------------------------------

    @staticmethod
    def _cookie(environ, wanted=COOKIE):
        for part in environ.get("HTTP_COOKIE", "")[:8192].split(";"):
            name, _, value = part.strip().partition("=")
            if name == wanted:
                return value
        return None

    def _sign(self, nonce):
        return hmac.new(self._secret, nonce.encode("ascii"), hashlib.sha256).hexdigest()[:32]

    def _new_token(self):
        """A session token this page issued: a nonce and its signature (nothing stored
        until the browser comes back with it)."""
        nonce = secrets.token_urlsafe(24)
        return "%s.%s" % (nonce, self._sign(nonce))

    def _issued(self, token):
        nonce, _, signature = token.partition(".")
        return bool(nonce) and nonce.isascii() and hmac.compare_digest(
            signature.encode("ascii", "replace"), self._sign(nonce).encode("ascii"))

    def _session(self, environ, create=False):
        """The browser's session, or None. With create, a browser that came back with a
        token this page issued gets its session now (the first page it asks for)."""
        token = self._cookie(environ)
        with self._lock:
            session = self._sessions.get(token) if token else None
            if session is not None:
                self._sessions.move_to_end(token)
                session.seen = time.monotonic()
                return session
            if not create or not token or not self._issued(token):
                return None
            chosen = _clean_name(urllib.parse.unquote(self._cookie(environ, NAME_COOKIE) or ""))
            session = _Session(chosen or self.labeller, token)
            self._sessions[session.token] = session
            while len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
            return session

    def _welcome(self, query):
        """A GET without a session: a redirect to the page that sets the session cookie,
        or, when the client came back from that redirect without the cookie, a page that
        holds no image. Neither claims anything."""
        cookie = ("Set-Cookie", "%s=%s; HttpOnly; SameSite=Strict; Path=/"
                  % (COOKIE, self._new_token()))
        view = self._view(query.get("view"))
        if NEW_SESSION not in query:
            location = "/?" + urllib.parse.urlencode(
                {"view": view, "focus": _int(query.get("focus"), 0), NEW_SESSION: 1})
            return 303, [("Location", location), ("Cache-Control", "no-store"), cookie,
                         ("Content-Type", "text/plain; charset=utf-8")], b"see /\n"
        body = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                "<title>slimserve-label</title><link rel=\"stylesheet\" href=\"/app.css\">"
                "</head><body><header><h1>Labelling served images</h1></header>"
                "<p id=\"start\">This page hands images to label to a browser session (a "
                "cookie), so that two labellers see different ones. <a href=\"/?view=%s\">"
                "Start labelling</a></p></body></html>\n" % _e(view))
        return 200, [("Content-Type", "text/html; charset=utf-8"),
                     ("Cache-Control", "no-store"), cookie], body.encode("utf-8")

    # --- decisions -----------------------------------------------------------------

    def _decide(self, session, form):
        rid = form.get("request_id", "")
        item = self.items.get(rid) if _ID.match(rid) else None
        if item is None:
            return self._text(404, "no such image on this page")
        choice = form.get("choice", "")
        label = None
        if choice.startswith("label:"):
            try:
                label = int(choice[len("label:"):])
            except ValueError:
                label = -1
            if not 0 <= label < len(self.classes):
                return self._text(400, "no such class")
            decision = store_lib.LABEL
        elif choice in (store_lib.NONE, store_lib.SKIP):
            decision = choice
        else:
            return self._text(400, "choose a class, none or skip")
        record = self._record(item, session, decision, label)
        try:
            image = items_lib.original_image(item) if label is not None else None
            self.store.decide(record, image, item.extension)
        except store_lib.AlreadyDecided as taken:
            if taken.record.get("session") == session.id:
                return self._redirect(form)  # a second click on the same decision
            return self._index(None, session, 409, self._taken(taken.record), form)
        except items_lib.ItemGone as gone:
            return self._index(None, session, 410, str(gone), form)
        except errors.UserError as error:  # the disk refused: nothing was written
            logging.warning("labelling page: %s", error)
            return self._index(None, session, 507, "not saved: %s" % error, form)
        logging.info("%s: %s %s%s", record["labeller"], decision, rid,
                     " as %s" % self.classes[label] if label is not None else "")
        return self._redirect(form)

    def _taken(self, record):
        who = record.get("labeller") or "another labeller"
        if record.get("decision") == store_lib.LABEL:
            what = "labelled %s" % record.get("class", "?")
        elif record.get("decision") == store_lib.NONE:
            what = "marked none of these"
        else:
            what = "skipped"
        return "already decided: %s was %s by %s at %s" % (
            record.get("request_id"), what, who, record.get("time", "?"))

    def _record(self, item, session, decision, label):
        candidate = item.candidate
        return {
            "request_id": item.request_id, "decision": decision, "label": label,
            "model": {"name": candidate.model_name, "version": candidate.model_version},
            "log": candidate.log, "index": candidate.index, "item": candidate.item,
            "logged_at": candidate.logged_at,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "labeller": session.labeller, "session": session.id,
            "top3": [{"index": c, "class": self._class_name(c), "probability": round(p, 6)}
                     for c, p in candidate.top],
            "score": candidate.score, "reasons": list(candidate.reasons),
            "image_sha256": item.image_sha256,
        }

    def _redirect(self, form):
        query = urllib.parse.urlencode({"view": self._view(form.get("view")),
                                        "focus": _int(form.get("focus"), 0)})
        return 303, [("Location", "/?" + query), ("Cache-Control", "no-store"),
                     ("Content-Type", "text/plain; charset=utf-8")], b"see /\n"

    def _view(self, value):
        return value if value in ("single", "grid") else self.view

    def _class_name(self, index):
        return self.classes[index] if 0 <= index < len(self.classes) else "#%d" % index

    # --- the page ------------------------------------------------------------------

    def _index(self, environ, session=None, status=200, message=None, form=None):
        headers = [("Content-Type", "text/html; charset=utf-8"), ("Cache-Control", "no-store")]
        if environ is not None:
            query = dict(urllib.parse.parse_qsl(environ.get("QUERY_STRING", ""),
                                                max_num_fields=MAX_FORM_FIELDS))
            session = self._session(environ, create=True)
            if session is None:
                return self._welcome(query)
        else:
            query = form or {}
        view = self._view(query.get("view"))
        shown = self.store.claim(session.id, list(self.items), self.grid_size,
                                 self.claim_seconds)
        order = [rid for rid in self.items if self.store.decision(rid) is None]
        focus = min(_int(query.get("focus"), 0), max(0, len(shown) - 1))
        held = sum(1 for rid in order if rid not in shown and self.store.holder(rid))
        body = self._html(session, view, shown, focus, len(order), held, status, message)
        return status, headers, body.encode("utf-8")

    def _html(self, session, view, shown, focus, undecided, held, status, message):
        counts = self.store.counts()
        other = "grid" if view == "single" else "single"
        parts = [
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
            "<title>slimserve-label</title>",
            "<link rel=\"stylesheet\" href=\"/app.css\">",
            "<script src=\"/app.js\" defer></script></head>",
            "<body class=\"%s\" data-focus=\"%d\">" % (view, focus),
            "<header><h1>Labelling served images</h1>",
            "<span id=\"counts\">%d to go on this page &middot; %d labelled &middot; %d none "
            "of these &middot; %d skipped%s</span>" % (
                undecided, counts[store_lib.LABEL], counts[store_lib.NONE],
                counts[store_lib.SKIP],
                " &middot; %d held by other labellers" % held if held else ""),
            "<form method=\"post\" action=\"/labeller\" id=\"labeller\">labelling as "
            "<input name=\"name\" value=\"%s\" maxlength=\"%d\" size=\"14\">"
            "<input type=\"hidden\" name=\"token\" value=\"%s\">"
            "<input type=\"hidden\" name=\"view\" value=\"%s\">"
            "<button type=\"submit\">rename</button></form>" % (
                _e(session.labeller), MAX_LABELLER_CHARS, _e(session.token), view),
            "<a id=\"view\" href=\"/?view=%s\">show %s</a></header>" % (
                other, "a grid" if other == "grid" else "one at a time"),
        ]
        if message:
            parts.append("<p id=\"message\" class=\"%s\">%s</p>" % (
                "error" if status >= 500 else "note", _e(message)))
        parts.append("<section id=\"legend\">")
        for index, name in enumerate(self.classes):
            key = CLASS_KEYS[index] if index < len(CLASS_KEYS) else None
            parts.append("<span class=\"class\">%s%s %s</span>" % (
                "<kbd>%s</kbd> " % key if key else "", _e(name),
                "".join("<img src=\"/example/%d/%d.png\" alt=\"\">" % (index, k)
                        for k in range(len(self.examples.get(index, []))))))
        parts.append("<span class=\"class\"><kbd>n</kbd> none of these</span>"
                     "<span class=\"class\"><kbd>s</kbd> skip</span>"
                     "<span class=\"class\"><kbd>&larr;</kbd><kbd>&rarr;</kbd> "
                     "previous / next image</span></section>")
        parts.append("<main id=\"cards\">")
        for position, rid in enumerate(shown):
            parts.append(self._card(self.items[rid], position, position == focus, session,
                                    view))
        parts.append("</main>")
        if not shown:
            parts.append("<p id=\"done\">Nothing left to label here%s.</p>" % (
                ": %d image(s) are held by other labellers; reload in a while" % held
                if held else ""))
        parts.append("<footer>%s</footer></body></html>\n" % "<br>".join(
            _e(note) for note in self.notes))
        return "".join(parts)

    def _card(self, item, position, focused, session, view):
        candidate = item.candidate
        rid = _e(item.request_id)
        top = []
        for index, probability in candidate.top:
            top.append("<li>%s <b>%.1f%%</b> %s</li>" % (
                _e(self._class_name(index)), 100.0 * probability,
                "".join("<img src=\"/example/%d/%d.png\" alt=\"\">" % (index, k)
                        for k in range(len(self.examples.get(index, []))))))
        buttons = []
        for index, name in enumerate(self.classes):
            key = CLASS_KEYS[index] if index < len(CLASS_KEYS) else ""
            buttons.append("<button type=\"submit\" name=\"choice\" value=\"label:%d\"%s>"
                           "%s%s</button>" % (index, " data-key=\"%s\"" % key if key else "",
                                              "<kbd>%s</kbd> " % key if key else "", _e(name)))
        version = candidate.model_version
        return "".join([
            "<article class=\"card%s\" id=\"card-%d\" data-request-id=\"%s\">" % (
                " focused" if focused else "", position, rid),
            "<img class=\"shot\" src=\"/image/%s.png\" alt=\"logged image %s\">" % (rid, rid),
            "<p class=\"meta\"><span class=\"rid\">%s</span><br>model <span class=\"model\">"
            "%s</span>%s &middot; logged %s &middot; %dx%d %s</p>" % (
                rid, _e(candidate.model_name or "?"),
                " version %d" % version if version is not None else "",
                _utc(candidate.logged_at), item.size[0], item.size[1], _e(item.image_format)),
            "<p class=\"meta reasons\">%s</p>" % _e("; ".join(candidate.reasons)),
            "<ol class=\"top\">%s</ol>" % "".join(top),
            "<form class=\"decide\" method=\"post\" action=\"/decide\">",
            "<input type=\"hidden\" name=\"token\" value=\"%s\">" % _e(session.token),
            "<input type=\"hidden\" name=\"request_id\" value=\"%s\">" % rid,
            "<input type=\"hidden\" name=\"view\" value=\"%s\">" % view,
            "<input type=\"hidden\" name=\"focus\" value=\"%d\">" % position,
            "".join(buttons),
            "<br><button type=\"submit\" class=\"other\" name=\"choice\" value=\"none\" "
            "data-key=\"n\"><kbd>n</kbd> none of these</button>",
            "<button type=\"submit\" class=\"other\" name=\"choice\" value=\"skip\" "
            "data-key=\"s\"><kbd>s</kbd> skip</button></form></article>",
        ])


def _int(value, default):
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return default
