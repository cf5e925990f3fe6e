"""XLA:GPU's library calls in the forecast (cuBLAS matmuls, cuDNN flash
attention) and the hot-spot table, on hand-written programs in the form
XLA:GPU prints them (lines cut from a deviceless H100 compile)."""
import pytest

from trm.forecast import hlo
from trm.forecast import network
from trm.forecast import ops
from trm.forecast import timeline

ONE_GPU = network.Fabric(((0, 0, 0),), (1, 1, 1), (False,) * 3, 1.0, 1.0, 1)

_GEMM = ('"gemm_backend_config":{{"selected_algorithm":"0","alpha_real":1,'
         '"beta":0,"dot_dimension_numbers":{{"lhs_contracting_dimensions":'
         '["{lhs}"],"rhs_contracting_dimensions":["{rhs}"],'
         '"lhs_batch_dimensions":[{batch}],"rhs_batch_dimensions":[{batch}]}},'
         '"precision_config":{{"operand_precision":["{precision}",'
         '"{precision}"],"algorithm":"ALG_UNSET"}},"epilogue":"DEFAULT"}}')
_FMHA = ('"cudnn_fmha_backend_config":{{"algorithm":{{"algo_id":"0"}},'
         '"fmha_scale":0.125,"intermediate_tensor_shape":{{"element_type":'
         '"BF16","dimensions":["8","12","1024","1024"],"tuple_shapes":[]}},'
         '"mask_type":"{mask}"}}')


def _program(body: str) -> timeline.Program:
  text = ("HloModule gpu, is_scheduled=true\n\nENTRY %main (a: bf16[4096,512],"
          " b: bf16[512,1024]) -> bf16[] {\n" + body + "\n}\n")
  return timeline.Program(text, ONE_GPU)


def _gemm(dtype="bf16", out="bf16", precision="DEFAULT"):
  return f"""
  %a = {dtype}[4096,512]{{1,0}} parameter(0)
  %b = {dtype}[512,1024]{{1,0}} parameter(1)
  %mm = ({out}[4096,1024]{{1,0}}, s8[4194304]{{0}}) custom-call(%a, %b), custom_call_target="__cublas$lt$matmul", metadata={{op_name="jit(train_step)/jvp(GPT)/while/body/closed_call/h_0/mlp/c_fc/dot_general"}}, backend_config={{"operation_queue_id":"0",{_GEMM.format(lhs=1, rhs=0, batch='', precision=precision)}}}
  ROOT %r = {out}[4096,1024]{{1,0}} get-tuple-element(%mm), index=0"""


def _cost(program: timeline.Program, name: str):
  comp = program.module.entry_computation
  return ops.gpu_library_cost(comp.by_name[name], comp)


def test_a_cublas_matmul_has_its_flops_and_bytes_less_the_workspace():
  program = _program(_gemm())
  flops, moved = _cost(program, "mm")
  assert flops == 2.0 * 4096 * 1024 * 512
  assert moved == 2 * (4096 * 512 + 512 * 1024 + 4096 * 1024)  # no s8 scratch
  totals = program.totals()
  assert (totals.flops, totals.hbm_bytes) == (flops, moved)


@pytest.mark.parametrize("precision, weight", [("DEFAULT", 2.0),
                                               ("HIGHEST", 15.0)])
def test_a_float32_matmul_counts_at_the_tf32_or_cuda_core_rate(precision,
                                                                weight):
  flops, moved = _cost(_program(_gemm("f32", "f32", precision)), "mm")
  assert flops == weight * 2.0 * 4096 * 1024 * 512
  assert moved == 4 * (4096 * 512 + 512 * 1024 + 4096 * 1024)


@pytest.mark.parametrize("target, mask, matmuls, half", [
    ("__cudnn$fmhaSoftmax", "NO_MASK", 2, False),
    ("__cudnn$fmhaSoftmax", "CAUSAL", 2, True),
    ("__cudnn$fmhaSoftmaxBackward", "CAUSAL", 5, True),
])
def test_cudnn_attention_flops_come_from_the_score_shape(target, mask,
                                                         matmuls, half):
  body = f"""
  %q = bf16[8,1024,12,64]{{3,2,1,0}} parameter(0)
  %k = bf16[8,1024,12,64]{{3,2,1,0}} parameter(1)
  %v = bf16[8,1024,12,64]{{3,2,1,0}} parameter(2)
  %att = (bf16[8,12,1024,64]{{3,1,2,0}}, f32[8,12,1024]{{2,1,0}}, u8[0]{{0}}) custom-call(%q, %k, %v), custom_call_target="{target}", backend_config={{"operation_queue_id":"0",{_FMHA.format(mask=mask)}}}
  ROOT %r = bf16[8,12,1024,64]{{3,1,2,0}} get-tuple-element(%att), index=0"""
  flops, moved = _cost(_program(body), "att")
  scores = 8 * 12 * 1024 * 1024
  assert flops == 2.0 * matmuls * scores * 64 * (0.5 if half else 1.0)
  qkv_out = 4 * 8 * 1024 * 12 * 64 * 2
  assert moved == qkv_out + 8 * 12 * 1024 * 4


def test_other_custom_calls_are_not_library_calls():
  body = """
  %a = bf16[4096,512]{1,0} parameter(0)
  ROOT %c = bf16[4096,512]{1,0} custom-call(%a), custom_call_target="Sharding"
"""
  assert _cost(_program(body), "c") is None


def test_hot_spots_name_the_model_code_and_sum_to_the_step():
  program = _program(_gemm())
  spots = program.hot_spots(1e15, 0.5, 1e12, top=5)
  assert [(s["op"], s["kind"], s["runs"]) for s in spots] == [
      ("mlp/c_fc/dot_general", "custom-call", 1)]
  step = program.play(1e15, 0.5, 1e12)
  assert spots[0]["seconds"] == pytest.approx(step.seconds)


def test_op_label_drops_transforms_and_control_flow():
  inst = hlo.Instruction(
      "x", (), "fusion", (),
      'metadata={op_name="jit(train_step)/transpose(jvp(TRM))/while/body/'
      'closed_call/branch_0_fun/ReasoningNet/layers_0/self_attn/mul"}')
  assert timeline.op_label(inst) == "layers_0/self_attn/mul"
  assert timeline.op_label(inst, depth=4) == (
      "ReasoningNet/layers_0/self_attn/mul")
  assert timeline.op_label(hlo.Instruction("y", (), "copy", (), "")) == "copy"
