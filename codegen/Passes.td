//===- Passes.td - lmcc conversion passes (codegen) --------------------------===//
#ifndef LMCC_CODEGEN_PASSES_TD
#define LMCC_CODEGEN_PASSES_TD

include "mlir/Pass/PassBase.td"

def LmToLoops : Pass<"lm-to-loops", "::mlir::ModuleOp"> {
  let summary = "Lower lm ops to buffer-level scf/memref/arith/math/vector loop nests (CPU kernels)";
  let description = [{
    Dialect conversion with one pattern per lm op, grouped by op family (codegen/LmToLoops/*.cpp). Tensors
    become memrefs; the `score` and `embed` entry points become `<model>_score_kernel(weights, ids, lengths,
    [spans,] token_logprobs, scores, n_scored)` (spans: mask-and-predict scoring) and `<model>_embed_kernel(weights, ids, lengths, out)` with the
    runtime's ABI (runtime/lib/lmrt.h), every weight a view at its offset in the flat weight buffer
    (codegen/Layout/WeightLayout.h); lm.fold functions write their tables and `<model>_init_kernel(weights)`
    packs the GEMM weights and calls them. Other functions (`logits`) are dropped. A library needs both
    entry points (the driver checks); lit tests may lower one. Needs `lm.model` on the
    module. Buffers are freed after their last use (addresses derived from them included) in the block that
    allocates them.
  }];
  let options = [
    Option<"gemm", "gemm", "std::string", "\"generated\"",
           "generated: vector microkernels over weights packed at load time; eigen: the runtime's Eigen GEMM">,
    Option<"vectorBits", "vector-bits", "int64_t", "0",
           "vector register width the GEMM tile is sized for (512: AVX-512, 256: AVX2); 0 = this host">,
    Option<"weightsDtype", "weights-dtype", "std::string", "\"f32\"",
           "element type of the packed GEMM weights: f32, or bf16 (pairs of bf16 in 32-bit words)">,
    Option<"bf16Dot", "bf16-dot", "std::string", "\"host\"",
           "with bf16 weights: amx = AMX tile dot products, yes = AVX512_BF16 dot products, no = widen to f32 in the "
           "kernel, host = as this CPU (targetBf16Kernel: amx where it has AMX-BF16, else yes where it has AVX512_BF16 at "
           "the FMA's rate)">,
    Option<"l1Ways", "l1-ways", "int64_t", "0",
           "ways of the target's L1 data cache, which picks the GEMM tile of weights whose depth is a multiple of "
           "1024 (GemmTile::forDepth) and whether the training GEMM's body for such a depth copies A "
           "(getOrCreateTrainGemm); 0 = this host's, -1 = unknown (the target's tile for every weight, no copy)">,
    Option<"halfBlocks", "half-blocks", "std::string", "\"host\"",
           "with 512-bit vectors: yes = the attention's score products take a tile's half-seen first and last key "
           "blocks at 8 lanes (for targets that split 512-bit operations, e.g. Zen 4), no = in 16-lane groups, "
           "host = as this CPU (targetSplitsWideVectors). Results are the same bits either way">
  ];
  let dependentDialects = ["::mlir::arith::ArithDialect", "::mlir::func::FuncDialect", "::mlir::math::MathDialect",
                           "::mlir::memref::MemRefDialect", "::mlir::scf::SCFDialect", "::mlir::vector::VectorDialect",
                           "::mlir::LLVM::LLVMDialect", "::mlir::amx::AMXDialect"];
}

#endif // LMCC_CODEGEN_PASSES_TD
