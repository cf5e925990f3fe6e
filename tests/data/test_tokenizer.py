"""Tokenizer loading, special tokens and the Instruct prompt."""
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from trm.data.text import tokenizer as tok_lib


def _write_tokenizer(directory, specials):
  vocab = {"[UNK]": 0, "def": 1, "fib": 2, "(": 3, ")": 4, ":": 5, "n": 6}
  tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
  tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
  tokenizer.add_special_tokens(specials)
  tokenizer.save(str(directory / "tokenizer.json"))


def test_loads_special_tokens_and_round_trips(tmp_path):
  _write_tokenizer(tmp_path, [tok_lib.END_OF_TEXT, tok_lib.IM_START,
                              tok_lib.IM_END, tok_lib.MASK, tok_lib.DLM_PAD])
  tok = tok_lib.load_tokenizer(str(tmp_path))
  assert (tok.eos_id, tok.im_end_id, tok.mask_id, tok.dlm_pad_id) == (
      7, 9, 10, 11)
  assert tok.stop_ids() == [7, 11, 9]
  ids = tok.encode("def fib ( n ) :")
  assert ids == [1, 2, 3, 6, 4, 5]
  assert tok.decode(ids).split() == ["def", "fib", "(", "n", ")", ":"]
  prompt_ids = tok.encode(tok_lib.chat_prompt("fib"))
  assert prompt_ids[0] == 8 and tok.im_end_id in prompt_ids


def test_base_tokenizer_has_no_dlm_pad(tmp_path):
  _write_tokenizer(tmp_path, [tok_lib.END_OF_TEXT, tok_lib.MASK])
  tok = tok_lib.load_tokenizer(str(tmp_path))
  assert tok.dlm_pad_id is None and tok.stop_ids() == [tok.eos_id]


def test_tokenizer_without_mask_token_is_a_clear_error(tmp_path):
  _write_tokenizer(tmp_path, [tok_lib.END_OF_TEXT])
  with pytest.raises(ValueError, match=r"no <\|mask\|> token"):
    tok_lib.load_tokenizer(str(tmp_path))


def test_missing_file_is_a_clear_error(tmp_path):
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    tok_lib.load_tokenizer(str(tmp_path))


def test_a_tokenizer_json_past_256_mib_is_refused_unread(tmp_path,
                                                         monkeypatch):
  """The tokenizers library read a 2 GiB (sparse) tokenizer.json whole,
  2.3 GB resident, before its parse error; vocab.json, merges.txt and the
  checkpoint's JSON files were already capped."""
  from trm.data.text import text_codecs  # pylint: disable=g-import-not-at-top
  path = tmp_path / "tokenizer.json"
  with open(path, "wb") as f:
    f.truncate(257 * 2**20)
  def read(*args):
    raise AssertionError("read whole")
  monkeypatch.setattr(tok_lib.Tokenizer, "from_file", read)
  message = (f"{path} is 269,484,032 bytes, no tokenizer.json (at most "
             "268,435,456); ")
  with pytest.raises(ValueError) as error:
    tok_lib.load_tokenizer(str(tmp_path))
  assert str(error.value) == (
      message + "use the file of the Hugging Face download.")
  with pytest.raises(ValueError) as error:
    text_codecs.HFTokenizerCodec(str(path))
  assert str(error.value) == (
      message + "pass the tokenizer.json of a Hugging Face download.")


def _write_slow_tokenizer(directory):
  """What DiffuCoder's and Dream's Hub repositories hold: the slow Qwen2
  tokenizer's vocab.json and merges.txt (a small byte-level BPE here), the
  special tokens in added_tokens.json and tokenizer_config.json, which
  names Dream's remote DreamTokenizer, and no tokenizer.json."""
  import json  # pylint: disable=g-import-not-at-top
  from tokenizers import ByteLevelBPETokenizer  # pylint: disable=g-import-not-at-top
  text = ["def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
          "I'm sure they'll say it's 12345 héllo wörld\r\n\t ok"] * 20
  bpe = ByteLevelBPETokenizer()
  bpe.train_from_iterator(text, vocab_size=300, min_frequency=2)
  bpe.save_model(str(directory))
  # Qwen2.5's files list some added tokens as not special (tool calls).
  specials = [tok_lib.END_OF_TEXT, tok_lib.IM_START, tok_lib.IM_END,
              "<tool_call>", tok_lib.MASK, tok_lib.DLM_PAD]
  added = {t: bpe.get_vocab_size() + i for i, t in enumerate(specials)}
  (directory / "added_tokens.json").write_text(json.dumps(added))
  (directory / "tokenizer_config.json").write_text(json.dumps({
      "tokenizer_class": "DreamTokenizer",
      "auto_map": {"AutoTokenizer": ["tokenization_dream.DreamTokenizer",
                                     None]},
      "added_tokens_decoder": {str(i): {
          "content": t, "lstrip": False, "normalized": False,
          "rstrip": False, "single_word": False,
          "special": t != "<tool_call>"} for t, i in added.items()},
      "eos_token": tok_lib.END_OF_TEXT, "pad_token": tok_lib.END_OF_TEXT,
      "bos_token": None, "unk_token": None, "errors": "replace",
      "split_special_tokens": False}))
  return added


def test_a_hub_download_without_tokenizer_json_loads_its_slow_files(
    tmp_path):
  # apple/DiffuCoder-7B-* and Dream-org/Dream-v0-* ship vocab.json and
  # merges.txt for their (slow) DreamTokenizer, no tokenizer.json: every
  # loader refused the published download ("tokenizer.json not found").
  added = _write_slow_tokenizer(tmp_path)
  tok = tok_lib.load_tokenizer(str(tmp_path))  # the tokenizers library only
  # What trm.generate / DiffusionLM and trm.export --tokenizer look for.
  assert tok_lib.has_tokenizer(str(tmp_path))
  assert (tok.eos_id, tok.im_end_id, tok.mask_id, tok.dlm_pad_id) == (
      added[tok_lib.END_OF_TEXT], added[tok_lib.IM_END],
      added[tok_lib.MASK], added[tok_lib.DLM_PAD])
  # Encodes as Qwen2's slow tokenizer, which DreamTokenizer copies, and as
  # transformers' conversion of it (Qwen2TokenizerFast).
  transformers = pytest.importorskip("transformers")
  slow = transformers.Qwen2Tokenizer.from_pretrained(str(tmp_path))
  fast = transformers.Qwen2TokenizerFast.from_pretrained(str(tmp_path))
  for text in ["def fib(n):\n    return fib(n - 1)  # 12345\n\n\t x",
               "  I'm sure they'll héllo wörld 😀 中文\r\n",
               "<tool_call>{}</tool_call> I'M SHOUTING'S",
               tok_lib.chat_prompt("fib") + tok_lib.MASK * 3]:
    assert tok.encode(text) == slow.encode(text, add_special_tokens=False)
    assert tok.encode(text) == fast.encode(text, add_special_tokens=False)
    assert tok.decode(tok.encode(text)) == text


def test_chat_prompt_matches_the_readme_layout():
  assert tok_lib.chat_prompt("Write fib.") == (
      "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
      "<|im_start|>user\nWrite fib.\n<|im_end|>\n<|im_start|>assistant\n")


def test_byte_tokenizer_round_trip_and_checks():
  import types
  tokenizer = tok_lib.ByteTokenizer(mask_id=500)
  ids = tokenizer.encode("é x")
  assert ids == list("é x".encode())
  assert tokenizer.decode(ids + [256, 500]) == "é x<|endoftext|><|mask|>"
  cfg = types.SimpleNamespace(mask_token_id=500, vocab_size=512)
  assert tok_lib.from_spec("bytes", cfg).vocab_size == 501
  with pytest.raises(ValueError, match="vocab_size=299"):
    tok_lib.from_spec("bytes", types.SimpleNamespace(mask_token_id=299,
                                                     vocab_size=299))
  with pytest.raises(ValueError, match="collides"):
    tok_lib.ByteTokenizer(mask_id=257)
