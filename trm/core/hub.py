"""Downloads from the Hugging Face Hub that fail fast, in one line, offline.

Every Hub download of the project (the Sudoku and Maze CSVs, GPT-2's weights
from a Hub model id, `DiffusionLM.from_pretrained("org/name")`) goes through
`download` (one file) or `snapshot` (a whole repository). Both:

- use `huggingface_hub` only (`pip install -e .[hub]`); without it they
  raise one line naming that command;
- return a cached copy when there is one and the Hub cannot be reached (or
  HF_HUB_OFFLINE=1, read at call time);
- check first that the Hub's host (or the proxy to it) resolves and
  accepts a connection
  (`unreachable`, `CHECK_TIMEOUT_S` each): without that, `huggingface_hub`
  retries a failed request five times with back-off (about 25 s, more with
  its timeouts) before it gives up;
- raise `HubUnavailable`, a ValueError whose one-line message ends with the
  caller's `offline_hint` (the flags of the command in hand that avoid the
  download), so a command-line tool prints it as `<tool>: error: ...`.

The endpoint is HF_ENDPOINT read at call time (huggingface_hub reads it once,
at import), so a test or a user can point it at a mirror, or at an
unresolvable host to simulate no network.
"""
from __future__ import annotations

import os
from typing import Callable, Optional, Sequence

from trm.core import net_probe

DEFAULT_ENDPOINT = "https://huggingface.co"
# How long the host-name look-up and the TCP connect each may take before a
# download: a host that does not answer in this time counts as no network.
CHECK_TIMEOUT_S = 3.0
# huggingface_hub's metadata (HEAD) request timeout, seconds (its default is
# 10; a reachable Hub answers in well under a second).
ETAG_TIMEOUT_S = 5.0
INSTALL_HINT = "pip install -e .[hub]"


class HubUnavailable(ValueError):
  """A Hub download could not be done (no network, no `huggingface_hub`, no
  such repository or file); the message is one line, `<cause>; <offline
  hint>`.

  `with_hint` swaps the hint, for a caller that knows the flags of the
  command in hand better than the code that downloaded (e.g. the trainer
  spells a builder's --source as --config.data.build.source).
  """

  def __init__(self, cause: str, offline_hint: str = ""):
    super().__init__(f"{cause}; {offline_hint}" if offline_hint else cause)
    self.cause, self.offline_hint = cause, offline_hint

  def with_hint(self, offline_hint: str) -> "HubUnavailable":
    error = HubUnavailable(self.cause, offline_hint)
    error.__cause__ = self.__cause__
    return error


def endpoint() -> str:
  """The Hub's address: HF_ENDPOINT if set, else huggingface.co."""
  return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def offline_mode() -> bool:
  """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set to a true value."""
  value = (os.environ.get("HF_HUB_OFFLINE")
           or os.environ.get("TRANSFORMERS_OFFLINE") or "")
  return value.strip().upper() in ("1", "ON", "YES", "TRUE")


def unreachable(url: str, timeout_s: float = CHECK_TIMEOUT_S
                ) -> Optional[str]:
  """None when the host of `url` resolves and accepts a TCP connection,
  each within `timeout_s` seconds; else why not, e.g. "its host hub.invalid
  does not resolve (no network?)".

  Checked before a download so that no network costs seconds, not the
  retries with back-off of the downloader. Through a proxy (HTTPS_PROXY
  ...), the proxy is checked: it resolves and connects to the host.
  """
  problem = net_probe.probe(url, timeout_s)
  if problem is None:
    return None
  named = (f"the proxy URL {problem.proxy} (from the environment's *_PROXY)"
           if problem.proxy else url)
  if problem.kind == "bad_url":
    return f"{named} is no URL ({problem.detail})"
  if problem.kind == "no_host":
    return f"{named} names no host"
  if problem.kind == "bad_port":
    return f"{named} has an invalid port"
  its = "its proxy" if problem.proxy else "its host"
  if problem.kind == "resolve":
    return f"{its} {problem.host} does not resolve (no network?)"
  return (f"{its} {problem.host}:{problem.port} does not accept a "
          f"connection within {timeout_s:g} s ({problem.detail})")


def _one_line(text: str, limit: int = 300) -> str:
  text = " ".join(str(text).split())
  return text if len(text) <= limit else text[:limit - 3] + "..."


def _huggingface_hub(what: str, offline_hint: str):
  try:
    # Optional dependency (`pip install -e .[hub]`), hence imported lazily.
    import huggingface_hub  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise HubUnavailable(
        f"downloading {what} from the Hugging Face Hub needs huggingface_hub "
        f"({INSTALL_HINT})", offline_hint) from None
  return huggingface_hub


def _reason(error: Exception) -> str:
  """A short, one-line cause for a failed `huggingface_hub` call."""
  # pylint: disable-next=import-outside-toplevel
  from huggingface_hub import utils as errors
  if isinstance(error, errors.GatedRepoError):
    return ("the repository is gated: accept its terms on the Hub and log in "
            "(huggingface-cli login)")
  if isinstance(error, errors.RepositoryNotFoundError):
    return "no such repository (or it is private: log in first)"
  if isinstance(error, errors.RevisionNotFoundError):
    return "no such revision"
  if isinstance(error, errors.LocalEntryNotFoundError):
    return "the Hub could not be reached and there is no cached copy"
  if isinstance(error, errors.EntryNotFoundError):
    return "no such file in the repository"
  return f"{type(error).__name__}: {_one_line(error, 160)}"


def _fetch(what: str, call: Callable[[bool], str], offline_hint: str) -> str:
  """Runs `call(local_files_only)`: from the cache only when offline or when
  the Hub's host does not resolve, else online (which falls back to the
  cache by itself on a network error)."""
  address = endpoint()
  offline = offline_mode()
  why_not = None if offline else unreachable(address)
  try:
    return call(offline or why_not is not None)
  except Exception as error:  # pylint: disable=broad-except
    # pylint: disable-next=import-outside-toplevel
    from huggingface_hub import utils as errors
    not_cached = isinstance(error, (errors.LocalEntryNotFoundError,
                                    errors.OfflineModeIsEnabled))
    if offline and not_cached:
      cause = "HF_HUB_OFFLINE is set and there is no cached copy"
    elif why_not is not None and not_cached:
      cause = f"{why_not}, and there is no cached copy"
    else:
      cause = _reason(error)
    raise HubUnavailable(f"could not download {what} from the Hugging Face "
                         f"Hub ({address}): {cause}", offline_hint) from error


def download(repo_id: str, filename: str, *, repo_type: str = "model",
             revision: Optional[str] = None, offline_hint: str,
             local_dir: Optional[str] = None) -> str:
  """Local path of `filename` of the Hub repository `repo_id`.

  Args:
    repo_id: e.g. "openai-community/gpt2" or "sapientinc/sudoku-extreme".
    filename: path inside the repository, e.g. "config.json".
    repo_type: "model", "dataset" or "space".
    revision: branch, tag or commit; None for the default branch.
    offline_hint: what to do without network, naming the flags of the
      command in hand; ends the error message.
    local_dir: store the file under this directory instead of the Hub cache
      (an existing, complete copy there is used offline).

  Raises:
    HubUnavailable: see the module docstring.
  """
  hub = _huggingface_hub(f"{filename} of {repo_id}", offline_hint)

  def call(local_files_only: bool) -> str:
    return hub.hf_hub_download(
        repo_id=repo_id, filename=filename, repo_type=repo_type,
        revision=revision, local_dir=local_dir, endpoint=endpoint(),
        etag_timeout=ETAG_TIMEOUT_S, local_files_only=local_files_only)

  return _fetch(f"{filename} of {repo_id}", call, offline_hint)


def snapshot(repo_id: str, *, allow_patterns: Optional[Sequence[str]] = None,
             revision: Optional[str] = None, offline_hint: str,
             repo_type: str = "model") -> str:
  """Local directory holding the files of the Hub repository `repo_id`
  (those matching `allow_patterns`, e.g. ["*.json", "*.safetensors"]; all
  when None). Arguments and errors as `download`."""
  hub = _huggingface_hub(repo_id, offline_hint)

  def call(local_files_only: bool) -> str:
    return hub.snapshot_download(
        repo_id=repo_id, repo_type=repo_type, revision=revision,
        allow_patterns=list(allow_patterns) if allow_patterns else None,
        endpoint=endpoint(), etag_timeout=ETAG_TIMEOUT_S,
        local_files_only=local_files_only)

  return _fetch(repo_id, call, offline_hint)
