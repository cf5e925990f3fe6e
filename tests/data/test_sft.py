"""Fine-tuning data: JSONL pairs, code packing, batching."""
import json
import os

import ml_collections
import numpy as np
import pytest

from trm.core import pipeline
from trm.data.text import sft


def test_jsonl_pairs_and_errors(tmp_path):
  path = tmp_path / "train.jsonl"
  path.write_text(json.dumps({"prompt": "p1", "response": "r1"}) + "\n\n"
                  + json.dumps({"prompt": "p2", "response": "r2"}) + "\n")
  assert sft.read_jsonl_pairs(str(path)) == [("p1", "r1"), ("p2", "r2")]
  path.write_text(json.dumps({"prompt": "p"}) + "\n")
  with pytest.raises(ValueError, match=r"train.jsonl:1: missing key"):
    sft.read_jsonl_pairs(str(path))
  path.write_text("{not json\n")
  with pytest.raises(ValueError, match=r"train.jsonl:1: not valid JSON"):
    sft.read_jsonl_pairs(str(path))


@pytest.mark.parametrize("record, message", [
    ({"prompt": None, "response": "r"},
     r'"prompt" must be a string, got null\.'),
    ({"prompt": "p", "response": ["a", "b"]},
     r'"response" must be a string, got an array \["a", "b"\]'),
    ({"prompt": "p", "response": 3}, r'"response" must be a string, got a '
     "number 3"),
])
def test_jsonl_values_must_be_strings(tmp_path, record, message):
  path = tmp_path / "train.jsonl"
  path.write_text(json.dumps({"prompt": "ok", "response": "ok"}) + "\n"
                  + json.dumps(record) + "\n")
  with pytest.raises(ValueError, match=r"train.jsonl:2: " + message):
    sft.read_jsonl_pairs(str(path))


def test_jsonl_strings_may_hold_unicode_line_separators(tmp_path):
  path = tmp_path / "train.jsonl"
  path.write_text(json.dumps({"prompt": "a\u2028b", "response": "c"},
                             ensure_ascii=False) + "\n", encoding="utf-8")
  assert sft.read_jsonl_pairs(str(path)) == [("a\u2028b", "c")]


def test_jsonl_saved_with_a_byte_order_mark_and_crlf_reads_the_same(
    tmp_path):
  """A JSONL file saved by a Windows editor (BOM, CRLF) was refused on line
  1 as not JSON; it reads as the plain file does."""
  path = tmp_path / "train.jsonl"
  path.write_bytes(b"\xef\xbb\xbf" + b'{"prompt": "p1", "response": "r1"}'
                   b'\r\n{"prompt": "p2", "response": "r2"}\r\n')
  assert sft.read_jsonl_pairs(str(path)) == [("p1", "r1"), ("p2", "r2")]


@pytest.mark.parametrize("reader", ["jsonl", "code"])
def test_non_utf8_files_name_the_file_and_offset(tmp_path, reader):
  path = tmp_path / ("train.jsonl" if reader == "jsonl" else "a.py")
  path.write_bytes(b'{"prompt": "p", "response": "r"}\n{"prompt": "\xe9"}\n')
  with pytest.raises(ValueError, match=rf"{path.name}: not UTF-8 text: byte "
                     r"0xe9 at offset 45 \(line 2\)"):
    if reader == "jsonl":
      sft.read_jsonl_pairs(str(path))
    else:
      sft.read_code_files(str(path))


def test_examples_without_a_response_or_room_for_one_are_dropped(
    tmp_path, caplog):
  """dllm drops an example whose prompt is longer than max_length
  (`post_process_dataset`) and one with an empty response (its
  `_extract_first_turn`); here either stopped the run. They are dropped
  with one warning counting them; dropping every one is an error. A prompt
  exactly seq_len long is kept with nothing scored, as dllm keeps it (its
  filter is `prompt_len <= max_length`, its labels all -100)."""
  from trm.data.text import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  path = tmp_path / "sft.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in [
      {"prompt": "a", "response": "b"}, {"prompt": "c", "response": " \n"},
      {"prompt": "x" * 17, "response": "y"}, {"prompt": "d", "response": "e"},
      {"prompt": "f", "response": ""}, {"prompt": "z" * 16, "response": "w"}
  ]) + "\n")
  data = ml_collections.ConfigDict(dict(
      source="files", format="jsonl", path=str(path), prompt_key="prompt",
      response_key="response", chat=False))
  tokenizer = tok_lib.ByteTokenizer(mask_id=500)
  tokens, maskable = sft.read_rows(data, tokenizer, 16)
  assert tokens[:, :2].tolist() == [[ord("a"), ord("b")],
                                    [ord("d"), ord("e")],
                                    [ord("z"), ord("z")]]
  assert tokens[2].tolist() == [ord("z")] * 16
  assert maskable.sum(axis=1).tolist() == [15, 15, 0]
  warnings = [r.getMessage() for r in caplog.records if "dropped" in
              r.getMessage()]
  assert warnings == [
      f"config.data.path={path}: 3 of 6 examples dropped, as dllm drops them"
      " (2 with an empty response, 1 whose prompt is longer than "
      f"seq_len=16; the first: {path}:2)."]
  path.write_text(json.dumps({"prompt": "x" * 17, "response": "y"}) + "\n"
                  + json.dumps({"prompt": "a", "response": ""}) + "\n")
  with pytest.raises(ValueError, match=(
      r"sft.jsonl: all 2 examples are dropped \(1 with an empty response, 1 "
      r"whose prompt .* seq_len=16; the first: .*sft.jsonl:1\)")):
    sft.read_rows(data, tokenizer, 16)


def test_pair_rows_pad_truncate_and_prompt_never_maskable():
  tokens, maskable = sft.pair_rows([([1, 2], [3, 4, 5]), ([6], [7] * 10)],
                                   seq_len=6, pad_id=0)
  np.testing.assert_array_equal(tokens, [[1, 2, 3, 4, 5, 0],
                                         [6, 7, 7, 7, 7, 7]])
  np.testing.assert_array_equal(maskable, [[0, 0, 1, 1, 1, 1],
                                           [0, 1, 1, 1, 1, 1]])
  with pytest.raises(ValueError, match="example 0 has a 7-token prompt, "
                     "longer than seq_len=6"):
    sft.pair_rows([([1] * 7, [2])], seq_len=6, pad_id=0)
  # A prompt filling the row is kept with nothing scored (dllm's rows).
  tokens, maskable = sft.pair_rows([([1] * 6, [2])], seq_len=6, pad_id=0)
  np.testing.assert_array_equal(tokens, [[1] * 6])
  assert not maskable.any()


def test_an_empty_prompt_leaves_the_first_token_unmasked():
  """A row's first token has no position before it to be predicted from
  (the logit shift): without a prompt (JSONL "prompt": "", chat=False) it
  is kept as context, as in packed rows, not masked and never scored."""
  tokens, maskable = sft.pair_rows([([], [5, 6, 7])], seq_len=5, pad_id=0)
  np.testing.assert_array_equal(tokens, [[5, 6, 7, 0, 0]])
  np.testing.assert_array_equal(maskable, [[0, 1, 1, 1, 1]])


def test_packing(tmp_path):
  (tmp_path / "a.py").write_text("x")
  (tmp_path / "sub").mkdir()
  (tmp_path / "sub" / "b.py").write_text("y")
  assert sft.read_code_files(str(tmp_path / "**" / "*.py")) == ["x", "y"]
  with pytest.raises(FileNotFoundError, match="No files match"):
    sft.read_code_files(str(tmp_path / "*.rs"))
  tokens, maskable = sft.packed_rows([[1, 2, 3], [4, 5]], seq_len=3, eos_id=9)
  np.testing.assert_array_equal(tokens, [[1, 2, 3], [9, 4, 5]])
  assert not maskable[:, 0].any() and maskable[:, 1:].all()


def test_a_link_cycle_under_a_code_glob_is_one_line_not_a_hang(tmp_path):
  """glob's ** follows links into directories: a link back to an ancestor
  read every file ~40 times (held-out rows copies of training rows), two
  such links walked 2**40 paths (a hang)."""
  (tmp_path / "a.py").write_text("x")
  (tmp_path / "sub").mkdir()
  (tmp_path / "sub" / "b.py").write_text("y")
  (tmp_path / "sub" / "up").symlink_to("..")
  pattern = str(tmp_path / "**" / "*.py")
  for second_link in (False, True):  # one link first: the old code ended
    if second_link:
      (tmp_path / "me").symlink_to(".")
    with pytest.raises(ValueError, match="a link back to") as e:
      sft.read_code_files(pattern, "data.path")
    assert "directory cycle" in str(e.value) and "data.path" in str(e.value)
  # Without the cycles every file is read once, and a link to a directory
  # already matched (a venv's lib64 -> lib) adds no second copy.
  (tmp_path / "sub" / "up").unlink()
  (tmp_path / "me").unlink()
  (tmp_path / "lib64").symlink_to("sub")
  assert sft.read_code_files(pattern) == ["x", "y"]


def test_a_hard_link_under_a_code_glob_is_read_once(tmp_path):
  """A hard link (or a bind-mounted folder) is the same file under another
  path that resolving links does not show: its rows repeated training rows
  (and could be held out as evaluation rows)."""
  (tmp_path / "a.py").write_text("x")
  (tmp_path / "b.py").write_text("y")
  os.link(tmp_path / "a.py", tmp_path / "c.py")
  assert sft.code_file_paths(str(tmp_path / "*.py")) == [
      str(tmp_path / "a.py"), str(tmp_path / "b.py")]


def test_code_quoting_special_token_names_is_text(tmp_path):
  """A source file that quotes "<|mask|>" or "<|endoftext|>" (tokenizer
  code does) put the mask id into clean rows, as input and as target, and
  a document break mid-file; the names are now encoded as their
  characters, and EOS comes only from packing."""
  from test_tokenizer import _write_tokenizer  # pylint: disable=g-import-not-at-top
  from trm.data.text import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  _write_tokenizer(tmp_path, [tok_lib.END_OF_TEXT, tok_lib.IM_START,
                              tok_lib.IM_END, tok_lib.MASK, tok_lib.DLM_PAD])
  tok = tok_lib.load_tokenizer(str(tmp_path))
  (tmp_path / "a.py").write_text(
      'def fib ( n ) : # "<|mask|>" a hole, "<|endoftext|>" the end\n' * 4)
  data = ml_collections.ConfigDict(dict(source="files", format="code",
                                        path=str(tmp_path / "*.py")))
  tokens, _ = sft.read_rows(data, tok, 8)
  assert tok.mask_id not in tokens and tok.eos_id not in tokens[:, :-1]
  # The chat template's own tokens are still parsed.
  assert tok.encode(tok_lib.chat_prompt("fib"))[0] == tok.tokenizer.token_to_id(
      tok_lib.IM_START)


@pytest.mark.parametrize("chat", [True, False])
def test_jsonl_quoting_special_token_names_is_text(tmp_path, chat):
  """A pair quoting "<|mask|>" (code about Dream) put the mask id into the
  clean prompt (a blank the model is asked to fill) and into the response
  as a target, and "<|endoftext|>" an EOS mid-answer; as in code files the
  names are now their characters, and only the template's are tokens. A
  pair without such names is tokenized as before, the template whole."""
  from test_tokenizer import _write_tokenizer  # pylint: disable=g-import-not-at-top
  from trm.data.text import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  _write_tokenizer(tmp_path, [tok_lib.END_OF_TEXT, tok_lib.IM_START,
                              tok_lib.IM_END, tok_lib.MASK, tok_lib.DLM_PAD])
  tok = tok_lib.load_tokenizer(str(tmp_path))
  path = tmp_path / "sft.jsonl"
  path.write_text(json.dumps({"prompt": "fib <|mask|> n",
                              "response": "def fib <|endoftext|> ( n )"})
                  + "\n" + json.dumps({"prompt": "fib", "response": "n"})
                  + "\n")
  data = ml_collections.ConfigDict(dict(
      source="files", format="jsonl", path=str(path), prompt_key="prompt",
      response_key="response", chat=chat))
  tokens, maskable = sft.read_rows(data, tok, 40)
  assert tok.mask_id not in tokens
  assert tok.eos_id not in tokens[0][maskable[0]]
  im_start = tok.tokenizer.token_to_id(tok_lib.IM_START)
  assert (tokens == im_start).sum(axis=1).tolist() == ([3, 3] if chat
                                                       else [0, 0])
  plain = tok.encode(tok_lib.chat_prompt("fib") if chat else "fib")
  assert tokens[1, :len(plain)].tolist() == plain
  assert not maskable[1, :len(plain)].any()


def test_batches_are_deterministic_cover_epochs_and_split_by_process():
  tokens = np.arange(10)[:, None] * np.ones((1, 4), np.int32)
  maskable = np.ones_like(tokens, bool)
  source = sft.SFTBatches(tokens, maskable, global_batch_size=4, seed=3,
                          num_batches=6)
  first_epoch = np.concatenate([source[k]["tokens"][:, 0] for k in (0, 1)])
  assert len(set(first_epoch)) == 8  # no row twice within an epoch
  assert not np.array_equal(source[0]["tokens"], source[2]["tokens"])
  halves = [sft.SFTBatches(tokens, maskable, global_batch_size=4, seed=3,
                           num_batches=6, process_index=i, process_count=2)
            for i in range(2)]
  np.testing.assert_array_equal(
      np.concatenate([h[5]["tokens"] for h in halves]), source[5]["tokens"])
  with pytest.raises(ValueError, match="cannot fill one global batch"):
    sft.SFTBatches(tokens, maskable, global_batch_size=16, seed=0,
                   num_batches=1)


def _row_ids(count):
  tokens = np.arange(count, dtype=np.int32)[:, None] * np.ones((1, 4),
                                                               np.int32)
  return tokens, np.ones_like(tokens, bool)


def test_a_position_saved_over_other_rows_is_refused(caplog):
  """An epoch's order depends on every row: rows added to the data file (or
  the held-out tail moved) make a saved position repeat some rows and skip
  others, so restoring it is refused (or, allowed, said in a warning)."""
  def batches(count, **kw):
    return pipeline.grain_iterator(sft.SFTBatches(
        *_row_ids(count), global_batch_size=8, seed=0, num_batches=6), **kw)

  first = batches(32)
  seen = [next(first)["tokens"][:, 0] for _ in range(2)]
  state = first.get_state()
  same = batches(32)
  same.set_state(state)  # the same rows: the stream goes on
  rest = [next(same)["tokens"][:, 0] for _ in range(2)]
  assert sorted(np.concatenate(seen + rest)) == list(range(32))
  with pytest.raises(ValueError, match=(
      r"^the training data \(config.data's files\) is not what it was "
      r"trained on \(data fingerprint \w+, saved \w+\), so its position "
      r"does not continue the stream it trained on \(rows would repeat, "
      r"others be skipped\); set config.allow_config_change=True")):
    batches(48).set_state(state)
  allowed = batches(48, allow_data_change=True)
  allowed.set_state(state)
  assert "Resuming although the training data" in caplog.text
  third = next(allowed)["tokens"]
  # A position saved before the fingerprint was kept restores as before.
  old = batches(48)
  old.set_state({"next_index": 2})
  np.testing.assert_array_equal(next(old)["tokens"], third)


def test_chat_rows_close_with_im_end_then_dlm_pad():
  from trm.data.text import tokenizer as tok_lib
  tokenizer = tok_lib.ByteTokenizer(mask_id=500)
  (prompt, response), = sft.chat_pair_ids([("hi", "ok")], tokenizer,
                                          chat=True)
  assert tokenizer.decode(prompt) == tok_lib.chat_prompt("hi")
  assert response == [ord("o"), ord("k"), tokenizer.im_end_id]
  tokens, maskable = sft.pair_rows([(prompt, response)], len(prompt) + 5,
                                   pad_id=tokenizer.dlm_pad_id)
  assert tokens[0, -2:].tolist() == [tokenizer.dlm_pad_id] * 2
  assert maskable[0].tolist() == [False] * len(prompt) + [True] * 5


@pytest.mark.parametrize("prompt", ["Reverse a list.\n",
                                    "  Reverse a list. \n\n",
                                    "Quote <|mask|>.\n"])
def test_chat_rows_strip_the_prompt_as_generation_does(prompt):
  """Generation strips a chat query (DiffuCoder's `query.strip()`); the
  rows kept its trailing newline, so the model was fine-tuned on
  "...\n\n<|im_end|>" and prompted with "...\n<|im_end|>"."""
  import types  # pylint: disable=g-import-not-at-top
  from trm.data.text import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  tokenizer = tok_lib.ByteTokenizer(mask_id=500)
  (row_prompt, _), = sft.chat_pair_ids([(prompt, "r")], tokenizer, chat=True)
  lm = types.SimpleNamespace(tokenizer=tokenizer)
  assert row_prompt == inference.DiffusionLM.encode(lm, [prompt], chat=True)[0]
  # Without the template a prompt is text to continue, kept as it is.
  (raw, _), = sft.chat_pair_ids([(prompt, "r")], tokenizer, chat=False)
  assert raw == tokenizer.encode(prompt)


def test_chat_generation_encodes_special_names_as_the_rows_do(tmp_path):
  """The rows encode "<|mask|>" in a prompt as text; chat generation
  parsed it as the mask token, a blank in the prompt the sampler fills
  and the model never saw in fine-tuning."""
  import types  # pylint: disable=g-import-not-at-top
  from test_tokenizer import _write_tokenizer  # pylint: disable=g-import-not-at-top
  from trm.data.text import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  _write_tokenizer(tmp_path, [tok_lib.END_OF_TEXT, tok_lib.IM_START,
                              tok_lib.IM_END, tok_lib.MASK, tok_lib.DLM_PAD])
  tok = tok_lib.load_tokenizer(str(tmp_path))
  lm = types.SimpleNamespace(tokenizer=tok)
  for query in ["fib <|mask|> n", "fib <|im_end|> n", "def fib ( n )"]:
    (row_prompt, _), = sft.chat_pair_ids([(query, "n")], tok, chat=True)
    prompt, = inference.DiffusionLM.encode(lm, [query], chat=True)
    assert prompt == row_prompt and tok.mask_id not in prompt
    assert prompt.count(tok.im_end_id) == 2  # the template's own


def _conversation_rows(tmp_path, records, tokenizer, seq_len, chat=True):
  path = tmp_path / "sft.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  data = ml_collections.ConfigDict(dict(
      source="files", format="jsonl", path=str(path), prompt_key="prompt",
      response_key="response", chat=chat))
  return sft.read_rows(data, tokenizer, seq_len)


def test_messages_rows_score_the_last_assistant_turn_only(tmp_path):
  """dllm's SFT rows are `messages` lists (a system prompt, several
  turns); only prompt/response pairs were read. The prompt is every
  message before the last (with the assistant header), the loss scores
  the last assistant turn, <|im_end|> and the pads (dllm's
  `default_sft_map_fn`); one user/assistant exchange is the pair's row."""
  from trm.data.text import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  tokenizer = tok_lib.ByteTokenizer(mask_id=500)
  turns = [{"role": "system", "content": "Be terse."},
           {"role": "user", "content": "Add.\n"},
           {"role": "assistant", "content": "a+b"},
           {"role": "user", "content": "Subtract."},
           {"role": "assistant", "content": "a-b"}]
  tokens, maskable = _conversation_rows(
      tmp_path, [{"messages": turns}, {"prompt": "Add.", "response": "a+b"},
                 {"messages": turns[1:3]}], tokenizer, 300)
  prompt = ("<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\n"
            "Add.\n<|im_end|>\n<|im_start|>assistant\na+b<|im_end|>\n"
            "<|im_start|>user\nSubtract.\n<|im_end|>\n<|im_start|>"
            "assistant\n")
  ids = tokenizer.encode(prompt) + tokenizer.encode("a-b") + [
      tokenizer.im_end_id]
  assert tokens[0, :len(ids)].tolist() == ids
  assert (tokens[0, len(ids):] == tokenizer.dlm_pad_id).all()
  assert maskable[0].tolist() == ([False] * len(tokenizer.encode(prompt))
                                  + [True] * (300 - len(
                                      tokenizer.encode(prompt))))
  # One exchange without a system message: the pair's row exactly.
  np.testing.assert_array_equal(tokens[2], tokens[1])
  np.testing.assert_array_equal(maskable[2], maskable[1])


# This project's ChatML prompt (`tok_lib.chat_prompt`) as a Hugging Face
# chat template, for the reference's own way of splitting a conversation.
_CHAT_TEMPLATE = (
    "{% if messages[0].role == 'system' %}{% set system = "
    "messages[0].content %}{% set turns = messages[1:] %}{% else %}"
    "{% set system = 'You are a helpful assistant.' %}{% set turns = "
    "messages %}{% endif %}<|im_start|>system\n{{ system }}<|im_end|>\n"
    "{% for m in turns %}{% if m.role == 'user' %}<|im_start|>user\n"
    "{{ m.content | trim }}\n<|im_end|>\n{% else %}<|im_start|>"
    "{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_messages_rows_split_as_dllm_splits_them(tmp_path):
  """dllm's `default_sft_map_fn`: the row is the chat template over every
  message, the unscored prompt the template over all but the last with the
  generation prompt. A byte-level BPE (pieces merge across the template's
  boundaries as Qwen2's do) through `transformers`' apply_chat_template
  gives our row's tokens and the length of its unmasked prompt."""
  transformers = pytest.importorskip("transformers")
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # pylint: disable=g-import-not-at-top
  from trm.data.text import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
  vocab = {c: i for i, c in enumerate(alphabet)}
  vocab.update({"\u010a\u010a": len(vocab), "ab": len(vocab) + 1})
  bpe = Tokenizer(models.BPE(vocab, [("\u010a", "\u010a"), ("a", "b")]))
  bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  bpe.decoder = decoders.ByteLevel()
  bpe.add_special_tokens([tok_lib.END_OF_TEXT, tok_lib.IM_START,
                          tok_lib.IM_END, tok_lib.MASK, tok_lib.DLM_PAD])
  bpe.save(str(tmp_path / "tokenizer.json"))
  ours = tok_lib.load_tokenizer(str(tmp_path))
  reference = transformers.PreTrainedTokenizerFast(
      tokenizer_object=bpe, chat_template=_CHAT_TEMPLATE)
  conversations = [
      [{"role": "user", "content": "ab\n\n"},
       {"role": "assistant", "content": "ab ab"}],
      [{"role": "system", "content": "Reply\n\nab."},
       {"role": "user", "content": " ab"},
       {"role": "assistant", "content": "abab\n\n"},
       {"role": "user", "content": "again"},
       {"role": "assistant", "content": "ab"}]]
  tokens, maskable = _conversation_rows(
      tmp_path, [{"messages": m} for m in conversations], ours, 200)
  for row, messages in enumerate(conversations):
    whole = reference.apply_chat_template(messages, tokenize=True)
    prompt_len = len(reference.apply_chat_template(
        messages[:-1], tokenize=True, add_generation_prompt=True))
    # The reference's row ends "<|im_end|>\n"; ours closes with <|im_end|>
    # and pads (DiffuCoder-Instruct's recipe).
    assert tokens[row, :len(whole) - 1].tolist() == whole[:-1]
    assert maskable[row].tolist() == [False] * prompt_len + [True] * (
        200 - prompt_len)


@pytest.mark.parametrize("messages, message", [
    ([{"role": "user", "content": "q"}], "the last message is a user's"),
    ([{"role": "user", "content": "q"}, {"role": "system", "content": "s"},
      {"role": "assistant", "content": "a"}],
     r"a system message only comes first \(message 1"),
    ([{"role": "tool", "content": "q"}, {"role": "assistant", "content": "a"}],
     'message 0 is {"role": "tool"'),
    ([{"role": "user", "content": None}], 'message 0 is {"role": "user"'),
    ([], r"got \[\]"),
    ("hi", 'got "hi"'),
])
def test_bad_messages_name_the_line(tmp_path, messages, message):
  from trm.data.text import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match=r"sft.jsonl:2: \"messages\" must be a "
                     r'list of \{"role": \.\.\., "content": \.\.\.\} objects '
                     r"\(roles .*ending with the assistant's response.*"
                     + message):
    _conversation_rows(tmp_path, [{"prompt": "p", "response": "r"},
                                  {"messages": messages}],
                       tok_lib.ByteTokenizer(mask_id=500), 64)


def test_messages_need_the_chat_template(tmp_path):
  from trm.data.text import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match=(
      r"sft.jsonl:1: a \"messages\" conversation needs the chat template; "
      r"set config.data.chat=True")):
    _conversation_rows(tmp_path, [{"messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"}]}],
                       tok_lib.ByteTokenizer(mask_id=500), 64, chat=False)


def test_a_held_out_tail_left_out_is_said(caplog):
  """Held-out rows that do not fill the last eval batch are never
  evaluated: one warning says how many, naming the batch field."""
  tokens = np.zeros((10, 3), np.int32)
  maskable = np.ones_like(tokens, bool)
  sft.SFTEvalBatches(tokens, maskable, global_batch_size=5)
  sft.SFTEvalBatches(tokens, maskable, global_batch_size=4, max_batches=1)
  assert not caplog.records
  sft.SFTEvalBatches(tokens, maskable, global_batch_size=4)
  assert [r.getMessage() for r in caplog.records] == [
      "10 held-out rows fill 2 eval batches of config.data.eval_batch_size="
      "4: the last 2 are left out of every evaluation. Hold out a multiple "
      "of it (data.eval_rows) to evaluate them all."]


@pytest.mark.parametrize("held, expected", [
    ({}, "8 held-out rows (the last config.data.eval_rows=8 rows of "
         "config.data.path=t.jsonl) cannot fill one eval batch of "
         "config.data.eval_batch_size=16; hold out more rows "
         "(data.eval_rows) or lower config.data.eval_batch_size."),
    ({"eval_path": "e.jsonl"},
     "8 held-out rows (config.data.eval_path=e.jsonl) cannot fill one eval "
     "batch of config.data.eval_batch_size=16; add rows to it or lower "
     "config.data.eval_batch_size.")])
def test_too_few_rows_name_where_they_come_from(held, expected):
  """data.eval_rows means nothing beside data.eval_path: the message names
  the rows' source and its remedy, and the batch field."""
  data = ml_collections.ConfigDict(dict(
      source="files", path="t.jsonl", eval_path="", eval_rows=8,
      tfds=dict(split="train", eval_split="")))
  data.update(held)
  train_from, held_from, more = sft.row_sources(data)
  tokens, maskable = _row_ids(8)
  with pytest.raises(ValueError) as info:
    sft.SFTEvalBatches(tokens, maskable, global_batch_size=16,
                       source=held_from, more=more)
  assert str(info.value) == expected
  with pytest.raises(ValueError, match=(
      r"^8 rows of config.data.path=t.jsonl cannot fill one global batch of "
      r"config.global_batch_size=16; add rows or lower "
      r"config.global_batch_size.$")):
    sft.SFTBatches(tokens, maskable, global_batch_size=16, seed=0,
                   num_batches=1, source=train_from)


def test_eval_batches_in_order_and_split_by_process():
  tokens = np.arange(10)[:, None] * np.ones((1, 3), np.int32)
  maskable = np.ones_like(tokens, bool)
  second = sft.SFTEvalBatches(tokens, maskable, global_batch_size=4,
                              process_index=1, process_count=2)
  assert len(second) == 2  # the last 2 rows do not fill a batch
  np.testing.assert_array_equal(second[0]["tokens"][:, 0], [2, 3])
  np.testing.assert_array_equal(second[1]["tokens"][:, 0], [6, 7])
  assert len(sft.SFTEvalBatches(tokens, maskable, global_batch_size=4,
                                max_batches=1)) == 1
  with pytest.raises(ValueError, match="cannot fill one eval batch"):
    sft.SFTEvalBatches(tokens, maskable, global_batch_size=11)


def test_one_key_for_prompt_and_response_is_refused(tmp_path):
  """prompt_key == response_key trained each row on its prompt copied as
  its response, without a word."""
  from trm.data.text import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  path = tmp_path / "sft.jsonl"
  path.write_text(json.dumps({"prompt": "a", "response": "b"}) + "\n")
  data = ml_collections.ConfigDict(dict(
      source="files", format="jsonl", path=str(path), prompt_key="response",
      response_key="response", chat=False))
  with pytest.raises(ValueError, match=r"config\.data\.prompt_key and "
                     r"config\.data\.response_key are both 'response'"):
    sft.read_rows(data, tok_lib.ByteTokenizer(mask_id=500), 16)


def test_a_directory_for_a_jsonl_file_is_not_called_missing(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"is not a regular file \(a "
                     r"directory.*set config\.data\.eval_path to a JSONL"):
    sft.read_jsonl_pairs(str(tmp_path), what="data.eval_path")
  with pytest.raises(FileNotFoundError, match="does not exist"):
    sft.read_jsonl_pairs(str(tmp_path / "absent.jsonl"))
