"""Crafted compiled-step files (a payload and header whose SHA-256 match, so
`read` accepts them): persistent ids naming unknown devices or bytes that
are no executable, and header fields of the wrong JSON type, are one line
(CompiledStepError), never a KeyError / IndexError / XLA or AttributeError
traceback. No step is compiled: nothing here needs a saved file."""
import io
import pickle

import pytest

from trm.core import compiled_step


class _Persistent:

  def __init__(self, pid):
    self.pid = pid


class _Pickler(pickle.Pickler):

  def persistent_id(self, obj):
    return obj.pid if isinstance(obj, _Persistent) else None


def _payload(pid) -> bytes:
  buffer = io.BytesIO()
  _Pickler(buffer).dump((_Persistent(pid), [], False))
  return buffer.getvalue()


@pytest.mark.parametrize("pid", [("device", 99999), ("exec", b"not xla"),
                                 (), "x"],
                         ids=["unknown device", "bytes not an executable",
                              "empty id", "string id"])
def test_a_crafted_persistent_id_is_one_line(pid):
  with pytest.raises(compiled_step.CompiledStepError) as info:
    compiled_step.load("step.bin", _payload(pid), None, None)
  message = str(info.value)
  assert "refused to unpickle its payload" in message
  assert "'step.bin'" in message and "\n" not in message


_RUN = {"environment": {"platform": "cpu"}, "mesh": {"axes": {}},
        "inputs": [], "config": {}, "config_sha256": "", "code_sha256": ""}


@pytest.mark.parametrize("field,value", [
    ("environment", []), ("environment", "cpu"), ("mesh", 3),
    ("config", ["a"]), ("inputs", {"a": 1}), ("inputs", [1, 2])])
def test_a_header_field_of_the_wrong_type_is_one_line(field, value):
  header = {"format": 1, **{k: v for k, v in _RUN.items()}, field: value}
  with pytest.raises(compiled_step.CompiledStepError) as info:
    compiled_step.check("step.bin", header, _RUN)
  message = str(info.value)
  assert "header is damaged" in message and "\n" not in message


def test_a_fifo_is_refused_unread(tmp_path):
  """Reading a FIFO would block until a writer comes: never opened."""
  import os  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / "step.bin")
  os.mkfifo(path)
  with pytest.raises(compiled_step.CompiledStepError,
                     match="is not a regular file"):
    compiled_step.read(path)


def _build_onto(module: str, name: str, attr: str) -> bytes:
  """A protocol-2 pickle that BUILDs {attr: numpy.dtype} onto the allowed
  global module.name itself (not an instance of it), then ends as a
  payload's (step, args, no_kwargs) tuple would."""
  return (b"\x80\x02c" + f"{module}\n{name}\n".encode()
          + b"N}X" + len(attr).to_bytes(4, "little") + attr.encode()
          + b"cnumpy\ndtype\ns\x86b0" + b"N]\x89\x87.")


def test_a_pickle_setting_attributes_of_an_allowed_class_is_refused():
  """Before: the unpickler built the state onto the class itself, so a
  crafted file replaced jax's `UnloadedMeshExecutable.load` (any attribute
  of any allowed class without a __setstate__) in the loading process."""
  from jax._src.interpreters import pxla  # pylint: disable=g-import-not-at-top
  real = pxla.UnloadedMeshExecutable.__dict__["load"]
  try:
    with pytest.raises(compiled_step.CompiledStepError) as info:
      compiled_step.load("step.bin", _build_onto(
          "jax._src.interpreters.pxla", "UnloadedMeshExecutable", "load"),
                         None, None)
    assert pxla.UnloadedMeshExecutable.__dict__["load"] is real
  finally:  # the old code's damage is not left to later tests
    pxla.UnloadedMeshExecutable.load = real
  message = str(info.value)
  assert "refused to unpickle its payload" in message, message
  assert "sets attributes of UnloadedMeshExecutable itself" in message
  assert "\n" not in message


@pytest.mark.parametrize("size", [b"1e400", b"NaN", b"-1e400"])
def test_a_header_payload_size_that_is_no_integer_is_one_line(tmp_path,
                                                              size):
  """Before: a payload_bytes of 1e400 (JSON's inf) stopped `read` with an
  OverflowError traceback."""
  path = tmp_path / "step.bin"
  path.write_bytes(compiled_step.MAGIC + b'{"payload_bytes": ' + size
                   + b', "payload_sha256": "0"}\n')
  with pytest.raises(compiled_step.CompiledStepError,
                     match="its header is damaged"):
    compiled_step.read(str(path))


def test_a_header_nested_past_the_recursion_limit_is_one_line(tmp_path):
  """Before: json's RecursionError traceback from `read`."""
  path = tmp_path / "step.bin"
  path.write_bytes(compiled_step.MAGIC + b"[" * 200_000 + b"\n")
  with pytest.raises(compiled_step.CompiledStepError,
                     match="its header is damaged"):
    compiled_step.read(str(path))
