//===- Logprob.cpp - lm-to-loops: the log-probability head and sentence outputs ===//
//
// lm.token_logprob streamed over vocabulary tiles (the [rows, V] logits never exist), lm.gather, and the
// ops that write an entry point's outputs: lm.sentence_score (score) and lm.mean_pool (embed).
//
//===----------------------------------------------------------------------===//
#include "codegen/LmToLoops/Lowering.h"
#include "codegen/LmToLoops/Scratch.h"

#include "llvm/Support/FormatVariadic.h"

using namespace mlir;

namespace lmcc::codegen {
namespace {

constexpr int64_t kLanes = 16; ///< f32 lanes of a 512-bit vector
using logprob::kChunk, logprob::kChunkRows;

/// Fused vocabulary projection + log-softmax + gather over work items of (up to kChunkRows rows, kChunk vocabulary
/// columns), the items split over the runtime's threads in one dispatch (one synchronization of the threads per
/// call): an item's logits come from the GEMM into a [rows, logprob::scratchWidth] scratch of its thread (at most
/// 256 KB, in its L2), and per row the item keeps its chunk's max M_c, the sum of its exponentials relative to it
/// S_c = sum_j e^(x_j - M_c) (16 f32 lanes, then double) and, in the chunk that holds it, the target's logit. A last
/// pass per row combines the chunks in order: m = max_c M_c, s = sum_c S_c e^(M_c - m) (double),
/// out[b, t] = logit[b, t - shift, ids[b, t]] - (m + log s). The items are fixed by the shapes alone, so a row's
/// result does not depend on the thread count; the [rows, V] logits never exist.
struct TokenLogprobLowering : LmLowering<lm::TokenLogprobOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::TokenLogprobOp t, Loops &L) const override {
    auto &b = L.b;
    Location loc = L.loc;
    L.lengths = L.in(t.getLengths());

    auto ht = L.typeOf(t.getHidden());
    int64_t D = ht.getDimSize(2), V = L.typeOf(t.getWeight()).getDimSize(0), shift = t.getShift();
    const int64_t chunks = logprob::chunks(V), width = logprob::scratchWidth(V);
    Value h = L.in(t.getHidden()), ids = L.in(t.getTargets()), out = L.alloc(t.getType());
    // Rows are (entry, position) pairs of the hidden states: [R0, R1, D] (R1 is L.N(), or 1 when pruned).
    auto hs = L.sizes(ht);
    Value R0 = hs[0], R1 = hs[1];
    Value rows = b.create<arith::MulIOp>(loc, R0, R1);
    auto alloc = [&](ArrayRef<int64_t> shape, Type elem, ValueRange dynamic) {
      return b.create<memref::AllocOp>(loc, MemRefType::get(shape, elem), dynamic, b.getI64IntegerAttr(64));
    };
    Value maxes = alloc({ShapedType::kDynamic, chunks}, L.f32(), rows);
    Value sums = alloc({ShapedType::kDynamic, chunks}, L.f64(), rows);
    Value targets = alloc({ShapedType::kDynamic}, L.f32(), rows);
    L.nest({rows}, [&](ValueRange r) { L.store(L.f32c(0), targets, r); });
    // Row r = (b, p) holds hidden position p; its target is ids[b, p + shift] when that exists.
    auto targetOf = [&](Value ids, Value R1, Value r) {
      Value bi = b.create<arith::DivUIOp>(loc, r, R1), p = b.create<arith::RemUIOp>(loc, r, R1);
      Value pt = b.create<arith::AddIOp>(loc, p, L.idx(shift));
      Value exists = L.lt(pt, R1);
      Value safe = L.select(exists, pt, L.idx(0));
      Value id = b.create<arith::IndexCastOp>(loc, b.getIndexType(), L.load(ids, {bi, safe}));
      return std::pair<Value, Value>{exists, id};
    };
    // Row r's partials of chunk c from row i of its logits C (the chunk's `cols` columns): the max exactly (f32;
    // four vector maxima over the columns by j mod 64, then their lanes combined: the same value in any order), the
    // exponentials 16 columns at a time in f32 lanes (emitVectorExp; at most kChunk / 16 terms each, in column
    // order, the lanes then added in pairs: l ^ 8, l ^ 4, l ^ 2, l ^ 1) and the last cols % 16 one by one, summed in
    // double; the target's logit when the chunk holds it. A NaN logit the max passes over (emitGreater) still makes
    // its exponential, the sum and the row's log-probability NaN. With one maximum chain, math.exp and in-order lane
    // reductions (vector.reduction: 15 dependent steps, NaN tests in the max's) these partials took 5.5% of T-TA
    // scoring at batch 32 (perf); now 2.5%, the entry 1.032x faster (bench/results/2026-12-05-logprob.md).
    auto partials = [&](Value C, Value i, Value r, Value c, Value cols, Value maxes, Value sums, Value targets,
                        Value ids, Value R1) {
      auto vec = VectorType::get({kLanes}, L.f32());
      auto roundDown = [&](Value x, int64_t unit) {
        return b.create<arith::MulIOp>(loc, b.create<arith::DivUIOp>(loc, x, L.idx(unit)), L.idx(unit));
      };
      Value cols16 = roundDown(cols, kLanes);
      // step(x, accumulator) over the vectors [from, to) of row i with init.size() accumulators (accumulator w takes
      // the vectors w, w + ways, ... of the range).
      auto vectorLoop = [&](Value from, Value to, SmallVector<Value> init,
                            const std::function<Value(Value, Value)> &step) {
        const int64_t ways = init.size();
        auto loop = b.create<scf::ForOp>(loc, from, to, L.idx(ways * kLanes), init);
        OpBuilder::InsertionGuard guard(b);
        b.setInsertionPointToStart(loop.getBody());
        SmallVector<Value> next;
        for (int64_t w = 0; w < ways; ++w) {
          Value j = b.create<arith::AddIOp>(loc, loop.getInductionVar(), L.idx(w * kLanes));
          next.push_back(step(b.create<vector::LoadOp>(loc, vec, C, ValueRange{i, j}), loop.getRegionIterArgs()[w]));
        }
        b.create<scf::YieldOp>(loc, next);
        return SmallVector<Value>(loop.getResults());
      };
      // Lane 0 of the lanes of x combined in a butterfly (emitAcrossLanes).
      auto acrossLanes = [&](Value x, const std::function<Value(Value, Value)> &combine) -> Value {
        return b.create<vector::ExtractOp>(loc, emitAcrossLanes(b, loc, x, combine), ArrayRef<int64_t>{0});
      };
      auto greater = [&](Value x, Value y) { return emitGreater(b, loc, x, y); };
      auto add = [&](Value x, Value y) -> Value { return b.create<arith::AddFOp>(loc, x, y); };
      Value cols64 = roundDown(cols, 4 * kLanes);
      SmallVector<Value> four = vectorLoop(
          L.idx(0), cols64, SmallVector<Value>(4, b.create<vector::BroadcastOp>(loc, vec, L.f32c(-INFINITY))), greater);
      Value vmax = vectorLoop(cols64, cols16, {greater(greater(four[0], four[1]), greater(four[2], four[3]))},
                              greater)[0];
      Value m = L.reduce(cols16, cols, acrossLanes(vmax, greater),
                         [&](Value j, Value mx) { return b.create<arith::MaximumFOp>(loc, mx, L.load(C, {i, j})); });
      Value mV = b.create<vector::BroadcastOp>(loc, vec, m);
      Value vsum =
          vectorLoop(L.idx(0), cols16, {b.create<vector::BroadcastOp>(loc, vec, L.f32c(0))}, [&](Value x, Value acc) {
            return b.create<arith::AddFOp>(loc, acc, emitVectorExp(b, loc, b.create<arith::SubFOp>(loc, x, mV)));
          })[0];
      Value m64 = L.toF64(m);
      Value sum = L.reduce(
          cols16, cols, L.toF64(acrossLanes(vsum, add)),
          [&](Value j, Value acc) {
            return b.create<arith::AddFOp>(
                loc, acc, b.create<math::ExpOp>(loc, b.create<arith::SubFOp>(loc, L.toF64(L.load(C, {i, j})), m64)));
          });
      L.store(m, maxes, {r, c});
      L.store(sum, sums, {r, c});
      auto [exists, id] = targetOf(ids, R1, r);
      Value first = b.create<arith::MulIOp>(loc, c, L.idx(kChunk));
      Value inChunk = L.andI(exists, L.andI(L.ge(id, first), L.lt(id, b.create<arith::AddIOp>(loc, first, cols))));
      L.when(inChunk, [&] { L.store(L.load(C, {i, b.create<arith::SubIOp>(loc, id, first)}), targets, {r}); });
    };
    auto chunkCols = [&](Value c) {
      Value left = b.create<arith::SubIOp>(loc, L.idx(V), b.create<arith::MulIOp>(loc, c, L.idx(kChunk)));
      return b.create<arith::MinSIOp>(loc, L.idx(kChunk), left);
    };
    if (L.isPacked(t.getWeight())) {
      // The generated GEMM through its task function (getOrCreateGemmTask, the one every linear's product runs),
      // called by address from the task's ctx: inlined into the items' task, LLVM scheduled its loops differently
      // and the vocabulary projection ran 3-5% slower (perf shares against the other GEMMs, T-TA n = 40).
      // The AMX kernel reads the rows rounded to bf16 pairs: made once, before the items.
      Loops::GemmInput hIn = L.gemmInput(L.address(h), rows, D);
      auto module = t->getParentOfType<ModuleOp>();
      const GemmTile tile = L.context.tileFor(D);
      func::FuncOp gemmTask = getOrCreateGemmTask(module, V, D, bool(t.getBias()), tile);
      const int64_t aCols =
          llvm::cast<MemRefType>(getOrCreateGemm(module, V, D, bool(t.getBias()), tile).getArgumentTypes()[0])
              .getDimSize(1);
      const int64_t packedRowCount = packedRows(V, D, tile.bf16());
      const int64_t panelsPerChunk = kChunk / kPanel, panels = (V + kPanel - 1) / kPanel;
      Value blocks = b.create<arith::DivUIOp>(loc, b.create<arith::AddIOp>(loc, rows, L.idx(kChunkRows - 1)),
                                              L.idx(kChunkRows));
      auto index = [&](Value i64) -> Value { return b.create<arith::IndexCastOp>(loc, b.getIndexType(), i64); };
      SmallVector<Value> scalars{
          rows, R1, blocks, index(hIn.address),
          index(L.address(L.weightView(L.packed(t.getWeight())->offset, {packedRowCount, kPanel}))),
          index(t.getBias() ? L.address(L.in(t.getBias())) : L.i64c(0)),
          index(b.create<LLVM::PtrToIntOp>(loc, b.getI64Type(), L.functionPointer(gemmTask)))};
      // Item = chunk * blocks + block: the items of one chunk (its weights) follow each other.
      auto item = [&](ArrayRef<Value> v, ArrayRef<Value> x, Value it) {
        Value ids = v[0], maxes = v[1], sums = v[2], targets = v[3];
        Value rows = x[0], R1 = x[1], blocks = x[2];
        auto i64 = [&](Value index) -> Value { return b.create<arith::IndexCastOp>(loc, b.getI64Type(), index); };
        Value c = b.create<arith::DivUIOp>(loc, it, blocks);
        Value r0 = b.create<arith::MulIOp>(loc, b.create<arith::RemUIOp>(loc, it, blocks), L.idx(kChunkRows));
        Value nb = b.create<arith::MinSIOp>(loc, L.idx(kChunkRows), b.create<arith::SubIOp>(loc, rows, r0));
        Value pBegin = b.create<arith::MulIOp>(loc, c, L.idx(panelsPerChunk));
        Value pEnd = b.create<arith::MinSIOp>(loc, b.create<arith::AddIOp>(loc, pBegin, L.idx(panelsPerChunk)),
                                              L.idx(panels));
        Value logits = alloc({ShapedType::kDynamic, width}, L.f32(), nb);
        // The GEMM task's ctx (Gemm.h): A (rows r0..), M, packed weight, its rows, bias, C, C's columns, first panel.
        Value aAddress =
            b.create<arith::AddIOp>(loc, i64(x[3]), b.create<arith::MulIOp>(loc, i64(r0), L.i64c(aCols * 4)));
        SmallVector<Value> fields{aAddress, i64(nb), i64(x[4]), L.i64c(packedRowCount), i64(x[5]), L.address(logits),
                                  L.i64c(width), i64(pBegin)};
        // One stack slot for every item of the loop around this body (an alloca inside the loop would grow the
        // stack by a ctx per item: thousands of items at large batches).
        Value ctx;
        {
          OpBuilder::InsertionGuard guard(b);
          b.setInsertionPoint(b.getInsertionBlock()->getParentOp());
          ctx = b.create<memref::AllocaOp>(loc, MemRefType::get({int64_t(fields.size())}, b.getI64Type()));
        }
        for (auto [k, field] : llvm::enumerate(fields))
          L.store(field, ctx, L.idx(k));
        auto ptr = LLVM::LLVMPointerType::get(b.getContext());
        auto taskType =
            LLVM::LLVMFunctionType::get(LLVM::LLVMVoidType::get(b.getContext()), {ptr, b.getI64Type(), b.getI64Type()});
        b.create<LLVM::CallOp>(loc, taskType,
                               ValueRange{b.create<LLVM::IntToPtrOp>(loc, ptr, i64(x[6])),
                                          b.create<LLVM::IntToPtrOp>(loc, ptr, L.address(ctx)), L.i64c(0),
                                          i64(b.create<arith::SubIOp>(loc, pEnd, pBegin))});
        Value cols = chunkCols(c);
        L.nest({nb}, [&](ValueRange i) {
          partials(logits, i[0], b.create<arith::AddIOp>(loc, r0, i[0]), c, cols, maxes, sums, targets, ids, R1);
        });
        b.create<memref::DeallocOp>(loc, logits);
      };
      Value items = b.create<arith::MulIOp>(loc, blocks, L.idx(chunks));
      SmallVector<Loops::TaskView> views;
      for (Value m : {ids, maxes, sums, targets})
        if (std::optional<Loops::TaskView> v = L.taskView(m))
          views.push_back(*v);
      if (views.size() < 4) // ids a strided view: the items on this thread
        L.nest({items}, [&](ValueRange it) { item({ids, maxes, sums, targets}, scalars, it[0]); });
      else
        L.rowTask(llvm::formatv("lm_logprob_items_{0}x{1}{2}_shift{3}_{4}", V, D, t.getBias() ? "_bias" : "", shift,
                                tile.name())
                      .str(),
                  views, scalars, items, b.create<arith::MulIOp>(loc, rows, L.idx(V * D)), item);
      L.release(hIn);
    } else {
      // The runtime's GEMM (--gemm eigen) per chunk into one [rows, width] buffer, then the chunk's rows in a row
      // task (the same partials, so the same numbers from the same logits).
      Value hPtr = L.pointer(h), wPtr = L.pointer(L.in(t.getWeight()));
      Value biasPtr = t.getBias() ? L.pointer(L.in(t.getBias())) : Value();
      Value logits = alloc({ShapedType::kDynamic, width}, L.f32(), rows);
      Value logitsPtr = L.pointer(logits);
      Value m64 = b.create<arith::IndexCastOp>(loc, b.getI64Type(), rows);
      auto ptrType = LLVM::LLVMPointerType::get(b.getContext());
      auto offsetPtr = [&](Value p, Value elements) {
        return b.create<LLVM::GEPOp>(loc, ptrType, L.f32(), p, ValueRange{elements});
      };
      SmallVector<Loops::TaskView> views;
      for (Value m : {logits, ids, maxes, sums, targets})
        if (std::optional<Loops::TaskView> v = L.taskView(m))
          views.push_back(*v);
      L.nest({L.idx(chunks)}, [&](ValueRange c) {
        Value cols = chunkCols(c[0]);
        Value first64 =
            b.create<arith::IndexCastOp>(loc, b.getI64Type(), b.create<arith::MulIOp>(loc, c[0], L.idx(kChunk)));
        Value wTile = offsetPtr(wPtr, b.create<arith::MulIOp>(loc, first64, L.i64c(D)));
        Value biasTile = biasPtr ? Value(offsetPtr(biasPtr, first64)) : Value(b.create<LLVM::ZeroOp>(loc, ptrType));
        b.create<func::CallOp>(loc, "lm_rt_sgemm_nt", TypeRange{},
                               ValueRange{m64, b.create<arith::IndexCastOp>(loc, b.getI64Type(), cols), L.i64c(D), hPtr,
                                          L.i64c(D), wTile, L.i64c(D), biasTile, logitsPtr, L.i64c(width)});
        auto row = [&](ArrayRef<Value> v, ArrayRef<Value> x, Value r) {
          partials(v[0], r, r, x[0], x[1], v[2], v[3], v[4], v[1], x[2]);
        };
        if (views.size() < 5) // ids a strided view: the rows on this thread
          L.nest({rows}, [&](ValueRange r) { row({logits, ids, maxes, sums, targets}, {c[0], cols, R1}, r[0]); });
        else
          L.rowTask(("lm_logprob_rows_shift" + Twine(shift) + "_c" + Twine(width) + "x" + Twine(chunks)).str(), views,
                    {c[0], cols, R1},
                    rows, b.create<arith::MulIOp>(loc, rows, b.create<arith::MulIOp>(loc, cols, L.idx(8))), row);
      });
      b.create<memref::DeallocOp>(loc, logits);
    }
    L.nest({R0, R1}, [&](ValueRange iv) {
      Value valid = L.andI(L.andI(L.ge(iv[1], L.idx(shift)), L.lt(iv[1], L.lengthOf(iv[0]))),
                           L.cmp(arith::CmpIPredicate::sge, L.load(ids, {iv[0], iv[1]}), L.i32c(0)));
      Value v = L.choose(
          valid, L.f32(),
          [&] {
            Value r = b.create<arith::AddIOp>(loc, b.create<arith::MulIOp>(loc, iv[0], R1),
                                              b.create<arith::SubIOp>(loc, iv[1], L.idx(shift)));
            Value m = L.reduce(L.idx(0), L.idx(chunks), L.f64c(-INFINITY), [&](Value c, Value mx) {
              return b.create<arith::MaximumFOp>(loc, mx, L.toF64(L.load(maxes, {r, c})));
            });
            Value s = L.reduce(L.idx(0), L.idx(chunks), L.f64c(0), [&](Value c, Value acc) {
              Value scale = b.create<math::ExpOp>(loc, b.create<arith::SubFOp>(loc, L.toF64(L.load(maxes, {r, c})), m));
              return b.create<arith::AddFOp>(loc, acc, b.create<arith::MulFOp>(loc, L.load(sums, {r, c}), scale));
            });
            Value lse = b.create<arith::AddFOp>(loc, m, b.create<math::LogOp>(loc, s));
            return L.toF32(b.create<arith::SubFOp>(loc, L.toF64(L.load(targets, r)), lse));
          },
          [&] { return L.f32c(0); });
      L.store(v, out, iv);
    });
    for (Value m : {maxes, sums, targets})
      b.create<memref::DeallocOp>(loc, m);
    return L.set(t, out);
  }
};

/// out[b, t] = lp[b, t - shift, ids[b, t]] for shift <= t < length and ids[b, t] >= 0, else 0
struct GatherLowering : LmLowering<lm::GatherOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::GatherOp g, Loops &L) const override {
    auto &b = L.b;
    Location loc = L.loc;
    L.lengths = L.in(g.getLengths());
    Value lp = L.in(g.getLogprobs()), ids = L.in(g.getTargets()), out = L.alloc(g.getType());
    int64_t shift = g.getShift();
    L.nest(L.sizes(g.getType()), [&](ValueRange iv) {
      Value valid = L.andI(L.andI(L.ge(iv[1], L.idx(shift)), L.lt(iv[1], L.lengthOf(iv[0]))),
                           L.cmp(arith::CmpIPredicate::sge, L.load(ids, {iv[0], iv[1]}), L.i32c(0)));
      Value v = L.choose(
          valid, L.f32(),
          [&] {
            Value id = b.create<arith::IndexCastOp>(loc, b.getIndexType(), L.load(ids, {iv[0], iv[1]}));
            return L.load(lp, {iv[0], b.create<arith::SubIOp>(loc, iv[1], L.idx(shift)), id});
          },
          [&] { return L.f32c(0); });
      L.store(v, out, iv);
    });
    return L.set(g, out);
  }
};

/// token_logprobs, score and n_scored of the score entry point, written into its output buffers.
struct SentenceScoreLowering : LmLowering<lm::SentenceScoreOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::SentenceScoreOp s, Loops &L) const override {
    auto &b = L.b;
    Location loc = L.loc;
    L.lengths = L.in(s.getLengths());

    auto outputs = L.outputs();
    if (outputs.size() < 3) // (a Diformer score also returns the length log-probabilities after these)
      return s.emitOpError("appears outside the score entry point");
    Value lp = L.in(s.getLogprobs()), ids = L.in(s.getIds());
    Value tokenLp = outputs[0], scores = outputs[1], nScored = outputs[2];
    int64_t first = s.getFirst();
    SmallVector<int32_t> skip(s.getSkip());
    L.nest({L.B()}, [&](ValueRange bi) {
      Value len = L.lengthOf(bi[0]);
      auto loop = b.create<scf::ForOp>(loc, L.idx(0), L.N(), L.idx(1), ValueRange{L.f64c(0), L.i32c(0)});
      {
        OpBuilder::InsertionGuard guard(b);
        b.setInsertionPointToStart(loop.getBody());
        Value t = loop.getInductionVar();
        Value id = L.load(ids, {bi[0], t});
        Value keep = L.andI(
            L.andI(L.ge(t, L.idx(first)), L.lt(t, len)),
            b.create<arith::XOrIOp>(loc, L.isOneOf(id, skip), b.create<arith::ConstantOp>(loc, b.getBoolAttr(true))));
        Value v = L.select(keep, L.load(lp, {bi[0], t}), L.f32c(0));
        L.store(v, tokenLp, {bi[0], t});
        Value acc = b.create<arith::AddFOp>(loc, loop.getRegionIterArgs()[0], L.toF64(v));
        Value cnt =
            b.create<arith::AddIOp>(loc, loop.getRegionIterArgs()[1], b.create<arith::ExtUIOp>(loc, L.i32(), keep));
        b.create<scf::YieldOp>(loc, ValueRange{acc, cnt});
      }
      L.store(L.toF32(loop.getResult(0)), scores, bi[0]);
      L.store(loop.getResult(1), nScored, bi[0]);
    });
    L.b.replaceOp(s, ArrayRef<Value>(outputs).take_front(3));
    return success();
  }
};

/// The embed entry point's output: the mean of h over valid, non-excluded positions (all valid ones when none is left).
struct MeanPoolLowering : LmLowering<lm::MeanPoolOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::MeanPoolOp m, Loops &L) const override {
    auto &b = L.b;
    Location loc = L.loc;
    L.lengths = L.in(m.getLengths());

    auto outputs = L.outputs();
    if (outputs.size() != 1)
      return m.emitOpError("appears outside the embed entry point");
    Value h = L.in(m.getHidden()), ids = L.in(m.getIds()), out = outputs[0];
    SmallVector<int32_t> exclude(m.getExclude());
    int64_t D = m.getType().getDimSize(1);
    // x / max(||x||_2, 1e-12) over row b of out, in double (as the reference executor).
    auto normalizeRow = [&](Value row) {
      Value sq = L.reduce(L.idx(0), L.idx(D), L.f64c(0), [&](Value c, Value acc) {
        Value v = L.toF64(L.load(out, {row, c}));
        return b.create<arith::AddFOp>(loc, acc, b.create<arith::MulFOp>(loc, v, v));
      });
      Value norm = b.create<arith::MaximumFOp>(loc, b.create<math::SqrtOp>(loc, sq), L.f64c(1e-12));
      L.nest({L.idx(D)}, [&](ValueRange c) {
        Value v = L.toF64(L.load(out, {row, c[0]}));
        L.store(L.toF32(b.create<arith::DivFOp>(loc, v, norm)), out, {row, c[0]});
      });
    };
    if (m.getCls()) { // row 0 of every sentence
      L.nest({L.B()}, [&](ValueRange bi) {
        L.nest({L.idx(D)}, [&](ValueRange c) { L.store(L.load(h, {bi[0], L.idx(0), c[0]}), out, {bi[0], c[0]}); });
        if (m.getNormalize())
          normalizeRow(bi[0]);
      });
      L.b.replaceOp(m, outputs);
      return success();
    }
    L.nest({L.B()}, [&](ValueRange bi) {
      Value len = L.lengthOf(bi[0]);
      auto excluded = [&](Value t) { return L.isOneOf(L.load(ids, {bi[0], t}), exclude); };
      Value kept = L.reduce(L.idx(0), len, L.i32c(0), [&](Value t, Value acc) {
        Value keep = b.create<arith::XOrIOp>(loc, excluded(t), b.create<arith::ConstantOp>(loc, b.getBoolAttr(true)));
        return b.create<arith::AddIOp>(loc, acc, b.create<arith::ExtUIOp>(loc, L.i32(), keep));
      });
      Value anyKept = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::sgt, kept, L.i32c(0));
      Value lenI32 = L.load(L.lengths, bi[0]);
      Value count = L.select(anyKept, kept, lenI32);
      Value countF = b.create<arith::SIToFPOp>(loc, L.f64(), count);
      // Token t counts when it is kept, or when no token is.
      auto use = [&](Value t) {
        return L.orI(L.notI(anyKept), L.notI(excluded(t)));
      };
      // Features 0..D16 in 16 double lanes (feature c's sum over t in order, as one by one), the rest one by one.
      const int64_t D16 = llvm::cast<MemRefType>(h.getType()).getLayout().isIdentity() ? D / kLanes * kLanes : 0;
      auto v32 = VectorType::get({kLanes}, L.f32()), v64 = VectorType::get({kLanes}, L.f64());
      Value zero64 = b.create<arith::ConstantOp>(loc, v64, DenseElementsAttr::get(v64, 0.0));
      Value countV = b.create<vector::BroadcastOp>(loc, v64, countF);
      auto blocks = b.create<scf::ForOp>(loc, L.idx(0), L.idx(D16), L.idx(kLanes));
      {
        OpBuilder::InsertionGuard guard(b);
        b.setInsertionPointToStart(blocks.getBody());
        Value c0 = blocks.getInductionVar();
        auto sums = b.create<scf::ForOp>(loc, L.idx(0), len, L.idx(1), ValueRange{zero64});
        {
          OpBuilder::InsertionGuard g2(b);
          b.setInsertionPointToStart(sums.getBody());
          Value t = sums.getInductionVar();
          Value x = b.create<arith::ExtFOp>(loc, v64,
                                            b.create<vector::LoadOp>(loc, v32, h, ValueRange{bi[0], t, c0}).getResult());
          Value v = L.select(use(t), x, zero64);
          b.create<scf::YieldOp>(loc, ValueRange{b.create<arith::AddFOp>(loc, sums.getRegionIterArgs()[0], v)});
        }
        Value mean = b.create<arith::TruncFOp>(loc, v32, b.create<arith::DivFOp>(loc, sums.getResult(0), countV));
        b.create<vector::StoreOp>(loc, mean, out, ValueRange{bi[0], c0});
      }
      L.nest({L.idx(D - D16)}, [&](ValueRange cc) {
        Value c = b.create<arith::AddIOp>(loc, cc[0], L.idx(D16));
        Value sum = L.reduce(L.idx(0), len, L.f64c(0), [&](Value t, Value acc) {
          Value v = L.select(use(t), L.toF64(L.load(h, {bi[0], t, c})), L.f64c(0));
          return b.create<arith::AddFOp>(loc, acc, v);
        });
        L.store(L.toF32(b.create<arith::DivFOp>(loc, sum, countF)), out, {bi[0], c});
      });
      if (m.getNormalize())
        normalizeRow(bi[0]);
    });
    L.b.replaceOp(m, outputs);
    return success();
  }
};

} // namespace

void populateLogprobPatterns(TypeConverter &converter, RewritePatternSet &patterns, const LoweringContext &context) {
  patterns.add<TokenLogprobLowering, GatherLowering, SentenceScoreLowering, MeanPoolLowering>(
      converter, patterns.getContext(), context);
}

} // namespace lmcc::codegen
