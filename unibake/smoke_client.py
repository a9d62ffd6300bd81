"""The smoke gate's HTTP client, run as ``python -m unibake.smoke_client`` (inside the scratch engine's
network namespace when there is one). Waits for /health, then asks for a chat completion per prompt
and prints one JSON line per step as it ends (``{"health": ...}`` or ``{"error": ...}``, then
``{"chat": ...}`` per prompt), so that a gate which has to stop it still knows which step never
ended. Standard library only.
"""

from __future__ import annotations

import http.client
import json
import sys
import time
import urllib.error
import urllib.request


MAX_BODY = 1 << 20  # a reply or health body larger than this is not an answer to a smoke prompt
MIN_WAIT = 5.0  # seconds: the least any prompt is given, however short the profile's timeout
HEALTH_WAIT = 3.0  # seconds: the least one ask of /health is given (the wait's own end may be nearer)
MAX_TOKENS = 64  # what a prompt without an expected reply asks for; one with asks for as many more as it has bytes
# what an engine's reply can raise: no connection, not HTTP (a bad status line, over 100 headers, a
# broken chunk), not JSON or nested past the parser's depth, not the shape of a chat completion
ENGINE_FAULTS = (OSError, ValueError, KeyError, IndexError, TypeError, http.client.HTTPException, RecursionError)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A 3xx is the engine's answer, not a way to another's: never followed (it may point anywhere, and
    what answers there would pass the gate for the engine); urllib then raises it as an HTTPError."""

    def _refused(self, req, fp, code, msg, headers):
        return None  # (its Location not even parsed: one that is no URL says nothing more)

    http_error_301 = http_error_302 = http_error_303 = http_error_307 = http_error_308 = _refused


# straight to the container: never through a proxy the environment names (http_proxy, all_proxy: a
# proxy cannot reach the verify engine's bridge, and would answer for the engine with its own error)
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirects())


def _why(exc: BaseException) -> str:
    """What went wrong, in a line: the engine's reply is the input here, so no traceback."""
    if isinstance(exc, RecursionError):
        return "the JSON body is nested too deeply"
    if isinstance(exc, UnicodeDecodeError):  # its reason alone ("invalid start byte") does not say what
        return f"the body is not UTF-8 text ({exc.reason} at byte {exc.start})"
    if isinstance(exc, UnicodeEncodeError):
        return f"the body holds {exc.object[exc.start:exc.end]!a}, a lone surrogate: not text a file can hold"
    if isinstance(exc, http.client.HTTPException) and not isinstance(exc, OSError):
        return f"not a well-formed HTTP reply ({type(exc).__name__}: {str(exc)[:200]!r})"
    if isinstance(exc, urllib.error.HTTPError):  # the status, and what the engine said about it
        try:
            said = exc.read(2048).decode("utf-8", "replace")
        except ENGINE_FAULTS:
            said = ""
        said = " ".join(said.split())
        status = f"HTTP {exc.code} {exc.reason}".rstrip()
        if 300 <= exc.code < 400:  # where it pointed: the gate judges the engine's own reply, never another's
            location = (exc.headers or {}).get("Location")
            status += (f", a redirect to {location[:200]!r} (not followed: the gate judges the engine's own reply)"
                       if location else ", a redirect with no Location (not an answer)")
        return status + (f": {said[:200]}" if said else "")
    return str(getattr(exc, "reason", exc))


def _not_text(content: object) -> str:
    """Why a reply's content is no answer, in JSON's words (not Python's: NoneType, dict)."""
    if content is None:
        return "the reply's content is null: the engine answered with no text"
    kind = ("true or false" if isinstance(content, bool) else "a number" if isinstance(content, (int, float))
            else "a list" if isinstance(content, list) else "an object" if isinstance(content, dict) else "not a string")
    return f"the reply's content is {kind} ({json.dumps(content)[:100]}), not text"


def _json_body(response) -> object:
    """The JSON of a response body: at most MAX_BODY bytes, UTF-8, and text every file can hold (a
    lone surrogate escaped in the JSON, "\\ud800", would pass a match and break the notes after)."""
    data = response.read(MAX_BODY + 1)
    if len(data) > MAX_BODY:
        raise ValueError(f"the body is over {MAX_BODY} bytes")
    # (a byte-order mark before it, as some servers write, is no part of the JSON: RFC 8259 lets a parser ignore it)
    value = json.loads(data.decode("utf-8-sig") or "{}")
    json.dumps(value, ensure_ascii=False).encode("utf-8")  # UnicodeEncodeError (a ValueError) on a lone surrogate
    return value


def _health_body(response) -> str:
    """What /health answered, as text: its status says the engine is up, whatever the body (JSON, a
    plain "OK", nothing, one of any size); at most MAX_BODY bytes of it are read."""
    data = response.read(MAX_BODY + 1)
    if len(data) > MAX_BODY:  # up all the same: its start kept as text, the rest never read
        return data[:MAX_BODY].decode("utf-8", "replace")
    try:
        # as text: nested JSON the parser here just read could be one level too deep for the gate's
        # parser, which reads it wrapped in a step's line
        return json.dumps(json.loads(data.decode("utf-8") or "{}"), sort_keys=True)
    except (ValueError, RecursionError):
        return data.decode("utf-8", "replace")


def chat(base_url: str, prompt: str, model: str, timeout: float, max_tokens: int = MAX_TOKENS) -> dict:
    """One chat completion: its reply and how long it took, or what went wrong. ``timeout`` bounds
    each wait on the engine (at least MIN_WAIT)."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": max_tokens, "temperature": 0}).encode()
    request = urllib.request.Request(f"{base_url}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    start = time.monotonic()
    try:
        with _OPENER.open(request, timeout=max(MIN_WAIT, timeout)) as response:
            reply = _json_body(response)
        try:
            content = reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise ValueError("the reply is not a chat completion (no choices[0].message.content): "
                             f"{json.dumps(reply)[:200]}") from None
        if not isinstance(content, str):
            raise TypeError(_not_text(content))
        return {"reply": content, "seconds": round(time.monotonic() - start, 3)}
    except ENGINE_FAULTS as exc:
        if isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError):
            # a model that answers slowly (its first request compiles, loads, warms up): say the bound, and its key
            why = (f"no reply within {max(MIN_WAIT, timeout):g} s (each prompt waits up to the profile's "
                   "smoke.timeout: raise it for a model that answers slowly)")
        else:
            why = _why(exc)
        return {"error": f"the chat completion failed: {why}", "seconds": round(time.monotonic() - start, 3)}


def probe(base_url: str, *, prompts: list[str], model: str, timeout: float, max_tokens: list[int] | None = None,
          on_step=lambda step: None) -> dict:
    """/health, then every prompt (each asking for at most its ``max_tokens``); ``on_step`` is given
    each step's record as it ends."""
    result: dict = {"health": None, "chats": []}
    start = time.monotonic()
    deadline = start + timeout
    last_error = ""
    while True:
        try:
            # each ask waits as long as the wait has left (at least HEALTH_WAIT): a /health that takes longer
            # than a few seconds to answer (one that runs the model, as TGI's does) never counted, however
            # long smoke.timeout, and failed the gate with "timed out"
            with _OPENER.open(f"{base_url}/health", timeout=max(HEALTH_WAIT, deadline - time.monotonic())) as response:
                body = _health_body(response)
                result["health"] = {"status": response.status, "body": body,
                                    "seconds": round(time.monotonic() - start, 3)}
            on_step({"health": result["health"]})
            break
        except ENGINE_FAULTS as exc:  # an engine still loading may answer anything: asked again until the timeout
            last_error = _why(exc)
            if isinstance(exc, urllib.error.HTTPError) and 300 <= exc.code < 400:
                # a redirect is an answer, not a load in progress: asking again gets the same one until the timeout
                result["error"] = f"{base_url}/health answered {last_error}"
                on_step({"error": result["error"]})
                return result
            if time.monotonic() > deadline:
                # where it was asked: the container's address on the engine's bridge, which a client outside
                # that engine's network (an engine elsewhere, --verify-engine) may not reach
                # and what bounds the wait: a model that loads for longer needs a larger smoke.timeout
                result["error"] = (f"{base_url}/health did not answer within {timeout:.0f} s ({last_error}; "
                                   "the profile's smoke.timeout bounds the wait)")
                on_step({"error": result["error"]})
                return result
            time.sleep(0.25)
    for prompt, most in zip(prompts, max_tokens or [MAX_TOKENS] * len(prompts)):
        # each its own bound (what the gate allows it), however late /health answered
        result["chats"].append(chat(base_url, prompt, model, timeout, most))
        on_step({"chat": result["chats"][-1]})
    return result


def main(argv: list[str]) -> int:
    """``URL MODEL TIMEOUT``, the prompts on standard input: a JSON list of ``[prompt, max_tokens]``."""
    base_url, model, timeout = argv[0], argv[1], float(argv[2])
    prompts = json.load(sys.stdin)
    probe(base_url, prompts=[p for p, _ in prompts], model=model, timeout=timeout,
          max_tokens=[most for _, most in prompts], on_step=lambda step: print(json.dumps(step), flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
