"""Redaction where lines leave the process (issue 40): the text rule, the wrapped streams and the
filter on every logging handler, whoever wrote the line."""
import io
import logging
import sys

import pytest

from distributed_runner.core import log
from distributed_runner.core.redact import REDACTED, redact_text

SECRET = "hunter2-secret"


@pytest.mark.parametrize("text, shown", [
    (f"API request to http://u:{SECRET}@127.0.0.1:9/api failed", "http://u:******@127.0.0.1:9"),
    (f"ray status --address drun:{SECRET}@10.0.0.1:6379", "drun:******@10.0.0.1:6379"),
    (f"AWS_SECRET_ACCESS_KEY={SECRET} AWS_ACCESS_KEY_ID=AKIA", "AWS_ACCESS_KEY_ID=AKIA"),
    (f"{{'password': '{SECRET}', 'lr': 0.1}}", "'password': '******', 'lr': 0.1"),
    (f'{{"api_key": "{SECRET}", "tokens_per_s": 1200}}', '"tokens_per_s": 1200'),
    (f"s3://b/x?secret_key={SECRET}&region=eu", "?secret_key=******&region=eu"),
])
def test_secrets_in_free_text_are_masked(text, shown):
    out = redact_text(text)
    assert SECRET not in out and REDACTED in out and shown in out


@pytest.mark.parametrize("text", [
    "unknown key: 'lr' in optim_wrapper",  # a key named in an error is not a secret
    "Epoch(train) [1][10/50] lr: 1.0e-02 loss: 0.5 tokens_per_s: 1234.5 max_tokens=5",
    "bos_token_id: 1, user@host, git@github.com:org/repo",
])
def test_what_is_not_a_secret_is_left_alone(text):
    assert redact_text(text) == text


def test_the_wrapped_stream_masks_and_passes_the_rest_through():
    raw = io.StringIO()
    stream = log.RedactingStream(raw)
    assert stream.write(f"token={SECRET}\n") == len(f"token={SECRET}\n")
    stream.writelines([f"http://a:{SECRET}@h\n"])
    assert SECRET not in raw.getvalue() and raw.getvalue().count(REDACTED) == 2
    assert stream.isatty() is False and stream.getvalue() == raw.getvalue()  # delegated


def test_redact_process_output_reaches_a_librarys_own_handler(monkeypatch):
    """A library logger with a handler of its own (MLflow has one) and an exception quoting a
    URL: both masked once the process's output is redacted; the streams wrapped once."""
    raw_out, raw_err, lib_out = io.StringIO(), io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", raw_out)
    monkeypatch.setattr(sys, "stderr", raw_err)
    library = logging.getLogger("some_library_of_a_user")
    handler = logging.StreamHandler(lib_out)
    library.addHandler(handler)
    try:
        log.redact_process_output()
        log.redact_process_output()
        assert isinstance(sys.stdout, log.RedactingStream)
        assert sys.stdout.wrapped is raw_out  # not wrapped twice
        try:
            raise ConnectionError(f"cannot reach http://u:{SECRET}@db:5432")
        except ConnectionError:
            library.exception("request to http://u:%s@db:5432 failed", SECRET)
        print(f"password={SECRET}")
        print(f"password={SECRET}", file=sys.stderr)
    finally:
        library.removeHandler(handler)
    for text in (lib_out.getvalue(), raw_out.getvalue(), raw_err.getvalue()):
        assert text and SECRET not in text, text
    assert "ConnectionError: cannot reach http://u:******@db:5432" in lib_out.getvalue()
