// core's tensor-core tile (core/tensor_tile.hpp) run on the host as the fused executor's CTA runs it: the chunks and
// blocks of core's walk (core::sum_tile, over the stages of panels and two accumulators, with copies and tensor cores
// that run asynchronously), the panels filled by core::fill_piece in a shuffled order (threads split them any way), the
// MMA's sum over the panels as core::panel_offset lays them out (test_tensor_tile_cute holds that against CuTe's MMA),
// and core's epilogue; a chunk with a value that is not a bf16 goes to core::gemm_element.
//
// The tensor cores' order of the fp32 sum is not the contract's, so the emulation sums in double, and the operands
// are integers (bf16, and e4m3 with scales 1 and 2): every partial sum is then exact in fp32 whatever its order, and
// the tile must give reference_gemm's bits. A wrong walk, orientation, offset, padding, part order, bias or epilogue
// changes them.
//
// One thread stands for the CTA here: that every thread which reads tensor memory waited for the MMAs itself, the
// fences, and the warps' uniformity are the device code's (cuda/tensor_tile.cuh), checked only statically.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "check.hpp"
#include "core/gemm_element.hpp"
#include "core/panel_boxes.hpp"
#include "core/scaled_block.hpp"
#include "core/tensor_tile.hpp"

using namespace mok_test;
namespace core = mok::core;
using core::kMmaCols;
using core::kMmaDepth;
using core::kMmaRows;
using core::kPanelValues;

namespace {

// TMA's tensor load of one box into a panel, as the PTX ISA describes it (2-D, no interleave, the 128-byte swizzle,
// zeros out of bounds): box element (x, y), x along dimension 0, is the map's at coords + (x, y), or 0 outside its
// dimensions, written at byte (y * box[0] + x) * 2 of the box with its 16-byte chunk within each 128 bytes xor'd with
// that 128-byte line's index mod 8 (the shared-memory address's bits 4 to 6 with bits 7 to 9: the box on 1024 bytes).
// `written` counts each panel value's writes.
void tma_load(const core::PanelMap& m, const core::PanelBox& box, core::bf16_t* panel, std::vector<int>& written) {
  for (uint64_t y = 0; y < m.box[1]; ++y)
    for (uint64_t x = 0; x < m.box[0]; ++x) {
      uint64_t at0 = static_cast<uint64_t>(box.coords[0]) + x, at1 = static_cast<uint64_t>(box.coords[1]) + y;
      core::bf16_t value(0);
      if (at0 < m.dims[0] && at1 < m.dims[1])
        std::memcpy(&value, reinterpret_cast<const char*>(m.base) + at1 * m.stride_bytes + at0 * sizeof(value),
                    sizeof(value));
      uint64_t byte = (y * m.box[0] + x) * sizeof(value);
      byte ^= (byte >> 7 & 7) << 4;
      size_t at = static_cast<size_t>(box.offset) + byte / sizeof(value);
      panel[at] = value;
      ++written[at];
    }
}

// Block b's panel of its part's a (second false) or b as TMA's loads fill it: the operand's map (core::part_map) and
// the block's boxes (core::block_boxes), each by tma_load. False, the panel untouched, when TMA does not take the
// operand. `written` (optional) counts each value's writes.
bool load_panel(const core::Gemm& g, const core::MmaBlock& b, int second, core::bf16_t* panel,
                std::vector<int>* written = nullptr) {
  core::PanelMap map{};
  if (!core::part_map(g, b.part, second, &map)) return false;
  std::vector<int> writes(kPanelValues, 0);
  core::PanelBox boxes[core::kPanelBoxes];
  int count = core::block_boxes(g, b, second, boxes);
  for (int box = 0; box < count; ++box) {
    CHECK_MSG(boxes[box].offset * sizeof(core::bf16_t) % 1024 == 0, "a box at value %d", boxes[box].offset);
    tma_load(map, boxes[box], panel, written ? *written : writes);
  }
  return true;
}

// fill_piece's and fill_codes' Move that counts the whole pieces copied.
struct CountedMove {
  int* copies;
  void operator()(core::Piece* to, const core::Piece* from) const {
    *to = *from;
    ++*copies;
  }
};

struct Counts {
  int tensor = 0, elements = 0;  // chunks through the tensor cores, and through gemm_element
  int overlaps = 0;              // fills while MMAs were still to run (EmulatedCta)
  int epilogue_overlaps = 0;     // epilogue slices written while the next chunk's MMAs were still to run
  int boxed = 0;                 // panels filled by TMA's boxes (EmulatedCta::boxes)
  int scaled = 0;                // blocks through the block-scaled MMA (EmulatedCta::scaled_mma)
};

// core::sum_tile's steps on the host, one thread for the whole CTA, over tensor cores that run asynchronously: the
// MMAs a multiply commits to a stage run later, in order, at a pace drawn at random, and read the stage's panels only
// when they run; a stage's barrier completes a phase as its commit's MMAs finish, and a wait is an mbarrier's parity
// wait on it. A fill's one-copy pieces land as a group, any time after the fill and at the latest when land waits
// for it (cp.async's groups; the others are written at once, as on the device), and are the other threads' only after
// the CTA's barrier (sync). A sync may also lose its vote to another thread whose wait ran out (`refuse`), and a land
// may find a TMA load that did not land in time (`lose_land`). The
// epilogue writes from an accumulator as it is when write is called. So a panel filled before the MMAs that read it
// ran, MMAs before their panels landed and were published, a wait for the wrong phase or one skipped, an accumulator
// read before its chunk's last MMAs ran, or summed into before its epilogue read it all, changes the sums or fails a
// check here.
struct EmulatedCta {
  struct Job {
    int stage, accumulator;
    bool first;
    core::PanelMajors majors;  // how the stage's panels hold a and b
    bool scaled;               // as codes and scales, for the block-scaled MMA
  };
  struct Group {  // one fill's one-copy pieces, in flight
    int stage;
    std::vector<std::pair<core::Piece*, core::Piece>> copies;
    bool landed = false;
    void land_now() {
      for (auto& [to, piece] : copies) *to = piece;
      landed = true;
    }
  };
  struct DeferredMove {  // fill_piece's Move: the copy joins the group, to land with it
    Group* group;
    void operator()(core::Piece* to, const core::Piece* from) const { group->copies.emplace_back(to, *from); }
  };
  struct Accumulator {
    std::vector<double> sums = std::vector<double>(kMmaRows * kMmaCols);
    int chunk = -1;     // the chunk its MMAs sum
    int written = 0;    // that chunk's epilogue slices written
    bool read = false;  // a slice read it since the CTA's last barrier
  };
  const core::Gemm* gemm = nullptr;  // the tile (start)
  std::mt19937_64& rng;
  std::vector<core::Piece> pieces = std::vector<core::Piece>(core::kPanelStages * core::kBlockPieces);
  std::vector<int> order = std::vector<int>(core::kBlockPieces);
  Accumulator accumulators[core::kAccumulators];
  std::vector<int> exact_chunks;         // per chunk of the tile: every value a bf16
  std::deque<Job> queued;                // committed, not yet run
  std::deque<Group> flying;              // started, not yet waited for by land
  uint32_t unpublished = 0;              // stages whose copies land waited for since the last sync
  uint32_t waited_since_vote = 0;        // stages whose waits passed since the last vote that passed
  int syncs = 0, refuse = -1;            // syncs so far; the one whose vote another thread's timeout fails
  int lands = 0, lose_land = -1;         // lands so far; the one whose wait for a TMA load runs out
  int block = -1;                        // the tile's block of the last multiply
  int filled = 0;                        // the tile's blocks filled
  int commits[core::kPanelStages] = {};  // per stage: its multiplies
  int phases[core::kPanelStages] = {};   // per stage: its barrier's completed phases
  int waited[core::kPanelStages] = {};   // per stage: its commits up to the last a wait passed
  int run = 0, stall = -1;               // MMAs run; the tensor cores stop before MMA number `stall`
  int last_multiplied = -1;              // the stage of the last multiply
  core::PanelMajors stage_majors[core::kPanelStages] = {};  // per stage: its last fill's block's (as the device keeps)
  bool stage_scaled[core::kPanelStages] = {};               // per stage: its last fill's block was a scaled one
  // The block-scaled MMA (`scaled_mma`): the blocks of the parts core::scaled_parts names are codes and scales
  // (core/scaled_block.hpp), each stage's scales in atoms beside its panels, and an MMA sums code x code x both scales.
  bool scaled_mma = false;
  uint32_t scaled = 0;  // the Cta's: the tile's parts taken block-scaled
  std::vector<uint8_t> atoms = std::vector<uint8_t>(core::kPanelStages * 2 * core::kScaleAtomBytes);
  Counts counts;
  std::string error;
  // TMA (`boxes`): the panels of the operands a map takes (core::boxed_operands) are box loads issued at the fill,
  // landing at their own pace and at the latest when waited for, each completing a phase of the stage's load barrier
  // once all of a fill's have landed; the issuer's bookkeeping is core's (land_loads), as the device keeps it.
  struct BoxFlight {
    int stage, second;
    core::MmaBlock block;
  };
  bool boxes = false;
  uint32_t boxed = 0;                       // the tile's boxed operands
  core::PanelStages loads;                  // across tiles, as the device's Storage
  int landed_fills = 0;                     // the tile's fills whose loads land() waited for
  std::vector<BoxFlight> box_flights;       // issued, not landed
  int box_issues[core::kPanelStages] = {};  // per stage: the fills that issued loads
  int box_phases[core::kPanelStages] = {};  // per stage: its load barrier's completed phases

  explicit EmulatedCta(std::mt19937_64& r) : rng(r) { std::iota(order.begin(), order.end(), 0); }
  // The next tile, on the stages and accumulators as the last one left them (as the device's CTA keeps them).
  void start(const core::Gemm& g) {
    gemm = &g;
    boxed = boxes ? core::boxed_operands(g) : 0;
    scaled = scaled_mma ? core::scaled_parts(g) : 0;
    landed_fills = 0;
    exact_chunks.assign(static_cast<size_t>(core::tensor_chunks(g)), 1);
    block = -1;
    filled = 0;
    last_multiplied = -1;
    counts = Counts{};
  }
  core::bf16_t* panels(int stage) { return pieces[stage * core::kBlockPieces].values; }
  uint8_t* codes(int stage) { return reinterpret_cast<uint8_t*>(panels(stage)); }
  uint8_t* scale_atoms(int stage) { return atoms.data() + stage * 2 * core::kScaleAtomBytes; }
  int per_chunk() const { return core::chunk_blocks(*gemm, scaled); }
  // A scaled block's MMAs: every product code x code x a's scale x b's, each read where core puts it.
  void multiply_scaled(std::vector<double>& sums, int stage) {
    const uint8_t* a = codes(stage);
    const uint8_t* b = a + kPanelValues * sizeof(core::bf16_t);
    const uint8_t* a_scales = scale_atoms(stage);
    const uint8_t* b_scales = a_scales + core::kScaleAtomBytes;
    for (int i = 0; i < kMmaRows; ++i)
      for (int j = 0; j < kMmaCols; ++j)
        for (int k = 0; k < core::kScaledDepth; ++k)
          sums[i * kMmaCols + j] += static_cast<double>(core::mx_value(a[core::code_offset(i, k)], 1.0f)) *
                                    core::mx_value(b[core::code_offset(j, k)], 1.0f) *
                                    core::e8m0_decode(a_scales[core::scale_offset(i, k / core::kMxBlock)]) *
                                    core::e8m0_decode(b_scales[core::scale_offset(j, k / core::kMxBlock)]);
  }
  bool run_one() {
    if (queued.empty() || run == stall) return false;
    Job job = queued.front();
    queued.pop_front();
    const core::bf16_t* a = panels(job.stage);
    const core::bf16_t* b = a + kPanelValues;
    std::vector<double>& sums = accumulators[job.accumulator].sums;
    if (job.first) std::fill(sums.begin(), sums.end(), 0.0);
    if (job.scaled) multiply_scaled(sums, job.stage);
    for (int i = 0; !job.scaled && i < kMmaRows; ++i)
      for (int j = 0; j < kMmaCols; ++j)
        for (int k = 0; k < kMmaDepth; ++k)
          sums[i * kMmaCols + j] +=
              static_cast<double>(core::bf16_to_float(a[core::panel_offset(job.majors.a, i, k)])) *
              core::bf16_to_float(b[core::panel_offset(job.majors.b, j, k)]);
    ++phases[job.stage];
    ++run;
    return true;
  }
  void progress() {  // the tensor cores, the copies and the box loads at their own pace
    while (rng() % 3 == 0 && run_one()) {
    }
    if (!flying.empty() && rng() % 4 == 0) flying[rng() % flying.size()].land_now();
    if (!box_flights.empty() && rng() % 4 == 0) land_boxes(box_flights[rng() % box_flights.size()].stage);
  }
  // The stage's box loads land, as TMA places them; the last completes its barrier's phase.
  void land_boxes(int stage) {
    bool any = false;
    for (size_t f = 0; f < box_flights.size();) {
      const BoxFlight& flight = box_flights[f];
      if (flight.stage != stage) {
        ++f;
        continue;
      }
      load_panel(*gemm, flight.block, flight.second, panels(stage) + flight.second * kPanelValues);
      box_flights.erase(box_flights.begin() + static_cast<long>(f));
      any = true;
    }
    if (any) ++box_phases[stage];
  }
  // The issuer's wait for a stage's loads (core::land_loads): the phase of its last fill's loads, which lands them
  // if they have not.
  bool loaded(int stage, uint32_t parity) {
    if (box_issues[stage] == 0 || parity != static_cast<uint32_t>((box_issues[stage] - 1) % 2))
      fail("stage " + std::to_string(stage) + ": a wait for its loads' parity " + std::to_string(parity) + " after " +
           std::to_string(box_issues[stage]) + " fills issued loads, not for the last one's phase");
    if (box_phases[stage] < box_issues[stage]) land_boxes(stage);
    return true;
  }
  void fail(const std::string& what) {
    if (error.empty()) error = what;
  }

  bool wait(int stage, uint32_t parity) {
    if (commits[stage] == 0 || parity != static_cast<uint32_t>((commits[stage] - 1) % 2))
      fail("stage " + std::to_string(stage) + ": a wait for parity " + std::to_string(parity) + " after " +
           std::to_string(commits[stage]) + " commits, not for the last one's phase");
    while (static_cast<uint32_t>(phases[stage] % 2) == parity)  // the phase of that parity has not completed
      if (!run_one()) return false;                             // the time out
    waited[stage] = commits[stage];
    waited_since_vote |= 1u << stage;
    return true;
  }
  bool fill(const core::MmaBlock& b, int stage) {
    for (const Job& job : queued)
      if (job.stage == stage) fail("stage " + std::to_string(stage) + " filled under MMAs that still read it");
    counts.overlaps += !queued.empty();
    if (stage == last_multiplied)
      fail("stage " + std::to_string(stage) + " filled right after its MMAs were issued: no overlap");
    std::fill(panels(stage), panels(stage) + 2 * kPanelValues, core::bf16_t(0x7fc0));  // NaN: a missed value shows
    std::shuffle(order.begin(), order.end(), rng);  // threads split the pieces any way
    flying.push_back(Group{stage, {}});
    bool exact = true;
    stage_majors[stage] = core::block_majors(*gemm, b);
    stage_scaled[stage] = b.scaled;
    if (b.scaled != (scaled >> b.part & 1u)) fail("a block of part " + std::to_string(b.part) + " scaled otherwise");
    if (b.scaled) {
      fill_scaled(b, stage, exact);
      return exact;
    }
    uint32_t by_box = boxed >> (2 * b.part) & 3u;  // as tensor_tile.cuh's fill: a's bit, b's
    for (int p : order)
      if (!(by_box >> (p >= core::kBlockPieces / 2 ? 1 : 0) & 1u))
        core::fill_piece(*gemm, b, p, panels(stage), exact, DeferredMove{&flying.back()});
    if (by_box) {
      for (const BoxFlight& flight : box_flights)
        if (flight.stage == stage) fail("stage " + std::to_string(stage) + " loaded again under loads in flight");
      for (int second = 0; second < 2; ++second)
        if (by_box >> second & 1u) box_flights.push_back(BoxFlight{stage, second, b});
      loads.committed(stage);
      ++box_issues[stage];
      counts.boxed += __builtin_popcount(by_box);
    }
    end_fill(exact);
    return exact;
  }
  // A scaled block's codes (whole pieces in the fill's group) and its scales, written at once, each NaN before.
  void fill_scaled(const core::MmaBlock& b, int stage, bool& exact) {
    std::fill(codes(stage), codes(stage) + 2 * kPanelValues * sizeof(core::bf16_t), uint8_t{0x7f});  // e4m3's NaN
    std::fill(scale_atoms(stage), scale_atoms(stage) + 2 * core::kScaleAtomBytes, uint8_t{0xff});    // e8m0's NaN
    for (int p : order) core::fill_codes(*gemm, b, p, codes(stage), DeferredMove{&flying.back()});
    for (int w = 0; w < core::kScaleWords; ++w) exact = core::fill_scales(*gemm, b, w, scale_atoms(stage)) && exact;
    ++counts.scaled;
    end_fill(exact);
  }
  void end_fill(bool exact) {
    if (!exact) exact_chunks[filled / per_chunk()] = 0;
    ++filled;
    progress();
  }
  bool land(int fills, int groups) {
    if (fills != filled)
      fail("a land after " + std::to_string(fills) + " fills by core's count, " + std::to_string(filled) + " made");
    for (; static_cast<int>(flying.size()) > groups; flying.pop_front()) {
      if (!flying.front().landed) flying.front().land_now();
      unpublished |= 1u << flying.front().stage;
    }
    landed_fills = core::land_loads(loads, landed_fills, fills - groups, *this);  // as tensor_tile.cuh's land_boxes
    return lands++ != lose_land;
  }
  void barrier() {  // the CTA's barrier: the epilogue's loads before it are done
    for (Accumulator& acc : accumulators) acc.read = false;
  }
  bool sync(bool ok) {
    barrier();
    progress();
    unpublished = 0;
    if (syncs++ == refuse) ok = false;
    if (ok) waited_since_vote = 0;
    return ok;
  }
  bool agree(bool yes) {
    barrier();
    progress();
    return yes;
  }
  void multiply(int stage, int accumulator, bool first) {
    if (waited[stage] != commits[stage])  // its barrier would be two phases on: a parity wait cannot tell them apart
      fail("stage " + std::to_string(stage) + " committed again before its last commit was waited for");
    for (const Group& group : flying)
      if (group.stage == stage) fail("stage " + std::to_string(stage) + " multiplied before its copies landed");
    for (const BoxFlight& flight : box_flights)
      if (flight.stage == stage) fail("stage " + std::to_string(stage) + " multiplied before its box loads landed");
    if (loads.busy(stage)) fail("stage " + std::to_string(stage) + " multiplied before its loads were waited for");
    if (unpublished >> stage & 1u)
      fail("stage " + std::to_string(stage) + " multiplied before the CTA's barrier after its copies landed");
    // The later blocks' copies in flight meanwhile: as many as the stages hold (all but this block's and the one
    // before's), or the tile has left.
    int blocks = core::tensor_chunks(*gemm) * per_chunk();
    size_t ahead = static_cast<size_t>(std::min(core::kPanelStages - 2, blocks - 1 - ++block));
    if (flying.size() != ahead)
      fail("block " + std::to_string(block) + " multiplied with " + std::to_string(flying.size()) +
           " later blocks' copies in flight, not " + std::to_string(ahead));
    Accumulator& into = accumulators[accumulator];
    if (first) {
      if (into.chunk >= 0 && into.written != core::kEpilogueSlices)
        fail("accumulator " + std::to_string(accumulator) + " summed into before chunk " + std::to_string(into.chunk) +
             "'s epilogue read it all");
      if (into.read)
        fail("accumulator " + std::to_string(accumulator) + " summed into before the CTA's barrier after its reads");
      into.chunk = block / per_chunk();
      into.written = 0;
    } else if (into.chunk != block / per_chunk()) {
      fail("block " + std::to_string(block) + " added to another chunk's accumulator");
    }
    queued.push_back(Job{stage, accumulator, first, stage_majors[stage], stage_scaled[stage]});
    last_multiplied = stage;
    ++commits[stage];
    progress();
  }
  void write(int chunk, int accumulator, int from, int to, bool exact) {
    const Accumulator& acc = accumulators[accumulator];
    if (acc.chunk != chunk) fail("chunk " + std::to_string(chunk) + " written from another chunk's accumulator");
    for (const Job& job : queued)
      if (job.accumulator == accumulator) fail("chunk " + std::to_string(chunk) + " written before its last MMAs ran");
    if (from != acc.written || to <= from || to > core::kEpilogueSlices)
      fail("chunk " + std::to_string(chunk) + ": slices [" + std::to_string(from) + ", " + std::to_string(to) +
           ") written after " + std::to_string(acc.written));
    if (exact != (exact_chunks[chunk] != 0)) fail("chunk " + std::to_string(chunk) + " judged by another's values");
    accumulators[accumulator].written = to;
    accumulators[accumulator].read = true;
    if (from == 0) ++(exact ? counts.tensor : counts.elements);
    counts.epilogue_overlaps += !queued.empty();  // the next chunk's MMAs still to run
    int row0 = core::chunk_row0(*gemm, chunk), col0 = core::chunk_col0(*gemm, chunk);
    if (!exact) core::chunk_elements(*gemm, chunk, from, to, core::kWhole);
    for (int i = 0; exact && i < kMmaRows; ++i)
      for (int j = from * core::kEpilogueColumns; j < to * core::kEpilogueColumns; ++j)
        core::tensor_epilogue(*gemm, row0 + i, col0 + j, static_cast<float>(acc.sums[i * kMmaCols + j]));
    progress();
  }
};

// The tile g as the fused executor's CTA runs it (cuda/tensor_tile.cuh compute): core::sum_tile over the emulated CTA,
// on the stages and accumulators as the CTA's last tile left them.
Counts run_tensor_tile(const core::Gemm& g, EmulatedCta& cta, core::PanelStages& stages) {
  cta.start(g);
  CHECK_MSG(core::sum_tile(g, stages, cta), "a wait ran out with no stall");
  CHECK_MSG(cta.error.empty(), "%s", cta.error.c_str());
  CHECK_MSG(cta.queued.empty(), "%zu MMAs still to run after the tile", cta.queued.size());
  int chunks = core::tensor_chunks(g);
  CHECK_MSG(cta.counts.tensor + cta.counts.elements == chunks, "%d of %d chunks written",
            cta.counts.tensor + cta.counts.elements, chunks);
  for (const auto& acc : cta.accumulators)
    CHECK_MSG(acc.chunk < 0 || acc.written == core::kEpilogueSlices, "chunk %d: %d of %d slices written", acc.chunk,
              acc.written, core::kEpilogueSlices);
  return cta.counts;
}

// One operand's storage: [rows, depth] values, bf16 or e4m3 (scales 2^0 or 2^1), K-major or MN-major; an MN-major
// one's k is `lead` values after k - 1's (at least rows; when not given, a multiple of 8 half the time, so that its
// pieces lie on 16 bytes and fill_piece copies them whole), the padding a NaN; a K-major one's rows are `lead` apart
// (at least depth; when not given, depth).
struct Stored {
  std::vector<core::bf16_t> bf16;
  std::vector<uint8_t> codes, scales;
  core::Operand op{};
};

void make_operand(Stored& s, bool e4m3, bool mn_major, int rows, int depth, std::mt19937_64& rng, int lead = 0) {
  std::uniform_int_distribution<int> value(-8, 8);
  if (!mn_major && lead == 0) lead = depth;
  if (lead == 0) lead = rng() % 2 ? (rows + 7) / 8 * 8 : rows + static_cast<int>(rng() % 3);
  int64_t row_stride = mn_major ? 1 : lead, depth_stride = mn_major ? lead : 1;
  size_t n = static_cast<size_t>(mn_major ? depth : rows) * lead;
  if (!e4m3) {
    s.bf16.assign(n, core::bf16_t(0x7fc0));
    for (int i = 0; i < rows; ++i)
      for (int k = 0; k < depth; ++k)
        s.bf16[i * row_stride + k * depth_stride] = core::float_to_bf16(static_cast<float>(value(rng)));
    s.op = core::bf16_operand(s.bf16.data(), row_stride, depth_stride, false);
    return;
  }
  core::MxScaleLayout layout = core::MxScaleLayout::of(rows, depth);
  s.codes.assign(n, 0x7f);  // e4m3's NaN
  for (int i = 0; i < rows; ++i)
    for (int k = 0; k < depth; ++k)
      s.codes[i * row_stride + k * depth_stride] = core::e4m3_encode(static_cast<float>(value(rng)));
  s.scales.assign(static_cast<size_t>(layout.matrix_bytes()), core::kMxPadScale);
  for (int r = 0; r < rows; ++r)
    for (int64_t b = 0; b < layout.k_blocks; ++b)
      s.scales[layout.offset(r, b)] = core::e8m0_encode(static_cast<int>(rng() % 2));
  s.op = core::e4m3_operand(s.codes.data(), row_stride, s.scales.data(), layout);
  s.op.depth_stride = depth_stride;
}

struct TileCase {
  std::vector<Stored> operands;
  std::vector<core::bf16_t> bias;
  std::vector<float> c;  // bf16 values as floats' room, or the fp32 sums
  core::Gemm g{};
  std::string text;
};

// A tile up to 300 x 300 of parts up to 200 deep, or (`deep`) up to 200 x 200 whose first part is 17 to 20 blocks deep:
// more blocks a chunk than the epilogue has slices, so that some steps write none. `scaled`: half the parts are e4m3
// a and b, K-major (core::scaled_part), their rows on 16 bytes half the time.
void make_case(TileCase& t, std::mt19937_64& rng, bool deep = false, bool scaled = false) {
  core::Gemm& g = t.g;
  int most = deep ? 200 : 300;
  g.rows = 1 + static_cast<int>(rng() % most);
  g.cols = 1 + static_cast<int>(rng() % most);
  g.num_parts = 1 + static_cast<int>(rng() % 2);
  g.epilogue = rng() % 2 ? core::Epilogue::store_bf16 : core::Epilogue::accumulate_f32;
  t.text = std::to_string(g.rows) + "x" + std::to_string(g.cols);
  t.operands.resize(2 * g.num_parts);
  for (int p = 0; p < g.num_parts; ++p) {
    int depth = deep && p == 0 ? 16 * kMmaDepth + 1 + static_cast<int>(rng() % (4 * kMmaDepth))
                               : 1 + static_cast<int>(rng() % 200);
    int align = scaled ? 16 : 8;
    if (rng() % 2) depth = (depth + align - 1) / align * align;  // K-major rows on 16 bytes: one copy a piece
    bool a_e4m3 = rng() % 2, b_e4m3 = rng() % 2, a_mn = rng() % 2, b_mn = rng() % 2;
    if (scaled && rng() % 2) a_e4m3 = b_e4m3 = true, a_mn = b_mn = false;
    make_operand(t.operands[2 * p], a_e4m3, a_mn, g.rows, depth, rng);
    make_operand(t.operands[2 * p + 1], b_e4m3, b_mn, g.cols, depth, rng);
    g.parts[p] = core::GemmPart{t.operands[2 * p].op, t.operands[2 * p + 1].op, depth};
    auto name = [](bool e4m3, bool mn) { return std::string(e4m3 ? "e4m3" : "bf16") + (mn ? " MN" : " K"); };
    t.text += "; part " + std::to_string(p) + " depth " + std::to_string(depth) + " a " + name(a_e4m3, a_mn) + ", b " +
              name(b_e4m3, b_mn);
  }
  g.c_stride = g.cols + static_cast<int>(rng() % 3);
  std::uniform_int_distribution<int> value(-64, 64);
  t.c.resize(static_cast<size_t>(g.rows) * g.c_stride);
  for (float& v : t.c) v = static_cast<float>(value(rng));
  g.c = t.c.data();
  if (g.epilogue == core::Epilogue::store_bf16 && rng() % 2) {
    t.bias.resize(static_cast<size_t>(g.cols));
    for (auto& b : t.bias) b = core::float_to_bf16(static_cast<float>(value(rng)));
    g.bias = t.bias.data();
    t.text += "; bias";
  }
  t.text += g.epilogue == core::Epilogue::store_bf16 ? "; store bf16" : "; accumulate fp32";
}

// The tile's c, run on `cta` and `stages`, against reference_gemm's from the same start, every word.
bool same_as_reference(TileCase& t, EmulatedCta& cta, core::PanelStages& stages, Counts* counts) {
  std::vector<float> start = t.c, scratch(core::gemm_scratch_floats(t.g.rows, t.g.cols, 1600, true));
  *counts = run_tensor_tile(t.g, cta, stages);
  std::vector<float> tiled = t.c;
  t.c = start;
  core::reference_gemm(t.g, scratch.data());
  size_t wrong = 0, first = 0;
  for (size_t e = 0; e < t.c.size(); ++e)
    if (core::float_bits(tiled[e]) != core::float_bits(t.c[e]) && wrong++ == 0) first = e;
  CHECK_MSG(wrong == 0, "%s: %zu of %zu words differ, the first at %zu: %a, reference %a", t.text.c_str(), wrong,
            t.c.size(), first, static_cast<double>(tiled[first]), static_cast<double>(t.c[first]));
  return wrong == 0;
}

}  // namespace

// The tiles one after another on one CTA, as the fused pass runs a worker's tiles: its stages' barriers and its
// accumulators carry from one into the next.
TEST(tensor_tiles_give_the_references_bits_on_integers) {
  std::mt19937_64 rng(seed() + 7);
  EmulatedCta cta(rng);
  core::PanelStages stages;
  int chunks = 0, overlaps = 0, epilogue_overlaps = 0, boxed = 0;
  for (int n = 0; n < 24; ++n) {
    TileCase t;
    make_case(t, rng, n % 8 == 0);
    cta.boxes = n % 3 != 0;  // two tiles in three with TMA's loads where a map takes an operand, on the same stages
    Counts counts;
    if (!same_as_reference(t, cta, stages, &counts)) return;
    CHECK_MSG(counts.elements == 0, "%s: %d integer chunks left to gemm_element", t.text.c_str(), counts.elements);
    chunks += counts.tensor;
    overlaps += counts.overlaps;
    epilogue_overlaps += counts.epilogue_overlaps;
    boxed += counts.boxed;
  }
  CHECK_MSG(chunks > 24, "only %d chunks", chunks);
  CHECK_MSG(boxed > 24, "only %d panels by TMA's boxes", boxed);
  // The stages' point: block b + 2's copies start while the MMAs of block b may still run (EmulatedCta checks each
  // block's stage and the copies in flight at each block's MMAs; here that the MMAs did run meanwhile, some of the
  // time). The accumulators': a chunk's epilogue is written while the next chunk's MMAs may still run.
  CHECK_MSG(overlaps > 0, "no fill of %d chunks' blocks overlapped MMAs", chunks);
  CHECK_MSG(epilogue_overlaps > 0, "no epilogue of %d chunks overlapped the next chunk's MMAs", chunks);
}

// Every third chunk of an e4m3 a from chunk 1 (rows 128 to 255, 512 to 639, ...) holds 1.875 x 2^-6 scaled by 2^-127:
// 1.875 x 2^-133, an fp32 but no bf16 (whose subnormals step by 2^-133). Those chunks go to gemm_element, the others to
// the tensor cores, and the whole tile is still reference_gemm's bits. With one to four blocks a chunk, the blocks of
// up to three chunks are filled before the first of them is judged; 34 chunks reuse the first ones' bits (chunk % 32)
// with another verdict (chunk 33 is exact, chunk 1 not). Then again with an e4m3 b, through the block-scaled MMA
// (core/scaled_block.hpp), whose codes and scales are the values themselves: its fill judges them alike.
TEST(chunks_with_values_that_are_not_bf16_are_computed_element_by_element) {
  std::mt19937_64 rng(seed() + 8);
  EmulatedCta cta(rng);
  core::PanelStages stages;
  for (int round = 0; round < 6; ++round) {
    bool scaled = round >= 3;
    int depth = std::vector<int>{40, 96, 200}[round % 3];
    cta.scaled_mma = scaled;
    TileCase t;
    int chunks = 34, inexact = (chunks + 1) / 3;
    t.g.rows = chunks * kMmaRows;
    t.g.cols = 100;
    t.g.num_parts = 1;
    t.g.epilogue = core::Epilogue::store_bf16;
    t.g.c_stride = t.g.cols;
    t.operands.resize(2);
    make_operand(t.operands[0], true, false, t.g.rows, depth, rng);
    make_operand(t.operands[1], scaled, false, t.g.cols, depth, rng);
    Stored& a = t.operands[0];
    core::MxScaleLayout layout = core::MxScaleLayout::of(t.g.rows, depth);
    for (int r = 0; r < t.g.rows; ++r)
      for (int k = 0; r / kMmaRows % 3 == 1 && k < depth; ++k) {
        a.codes[static_cast<size_t>(r) * depth + k] = core::e4m3_encode(1.875f * 0x1p-6f);
        a.scales[layout.offset(r, k / 32)] = 0;  // e8m0 0: 2^-127
      }
    t.g.parts[0] = core::GemmPart{a.op, t.operands[1].op, depth};
    t.c.assign(static_cast<size_t>(t.g.rows) * t.g.c_stride, 0.0f);
    t.g.c = t.c.data();
    t.text = std::to_string(t.g.rows) + "x100, depth " + std::to_string(depth) + ", chunks 1, 4, ... below bf16" +
             (scaled ? ", scaled" : "");
    CHECK(core::stored_value(a.op, 150, 3) == 1.875f * 0x1p-133f);
    Counts counts;
    if (!same_as_reference(t, cta, stages, &counts)) return;
    CHECK_MSG(counts.tensor == chunks - inexact && counts.elements == inexact,
              "%s: %d tensor chunks, %d element chunks", t.text.c_str(), counts.tensor, counts.elements);
    CHECK_MSG((counts.scaled > 0) == scaled, "%s: %d scaled blocks", t.text.c_str(), counts.scaled);
  }
}

// The block-scaled MMA (core/scaled_block.hpp) on the parts core::scaled_part takes, the other parts' blocks beside
// them in one chunk's sum, tile after tile on one CTA: reference_gemm's bits, as the bf16 route gives them. Its
// products are codes times both scales (scales 2^0 and 2^1 drawn per block of 32): a scale read for the wrong row or
// block, a code at the wrong place, or a part's blocks cut at the wrong depth changes them.
TEST(scaled_blocks_give_the_references_bits_on_integers) {
  std::mt19937_64 rng(seed() + 13);
  EmulatedCta cta(rng);
  core::PanelStages stages;
  int scaled = 0, mixed = 0;
  for (int n = 0; n < 16; ++n) {
    TileCase t;
    make_case(t, rng, n % 8 == 0, true);
    cta.scaled_mma = true;
    cta.boxes = n % 2 == 0;
    Counts counts;
    if (!same_as_reference(t, cta, stages, &counts)) return;
    CHECK_MSG(counts.elements == 0, "%s: %d integer chunks left to gemm_element", t.text.c_str(), counts.elements);
    scaled += counts.scaled;
    uint32_t parts = core::scaled_parts(t.g);
    mixed += t.g.num_parts == 2 && parts != 0 && parts != 3u;
  }
  CHECK_MSG(scaled > 16 && mixed > 0, "%d scaled blocks, %d tiles with a scaled part beside another", scaled, mixed);
}

// A scaled block's panels hold the operand's codes, each whole piece on 16 bytes one copy, zeros past its rows and
// depth, and its atoms the scales, kMxPadScale past them.
TEST(scaled_blocks_hold_the_codes_and_scales) {
  std::mt19937_64 rng(seed() + 14);
  for (int depth : {256, 200}) {  // rows on 16 bytes, or not (and a block past the depth)
    Stored a, b;
    make_operand(a, true, false, 150, depth, rng);
    make_operand(b, true, false, 130, depth, rng);
    for (Stored* o : {&a, &b})  // the layout's padding NaN: only the fill's kMxPadScale may stand there
      for (int64_t r = 0; r < o->op.scale_layout.padded_rows(); ++r)
        for (int64_t s = 0; s < o->op.scale_layout.padded_k_blocks(); ++s)
          if (r >= o->op.scale_layout.rows || s >= o->op.scale_layout.k_blocks)
            o->scales[o->op.scale_layout.offset(r, s)] = 0xff;
    core::Gemm g{};
    g.rows = 150;
    g.cols = 130;
    g.num_parts = 1;
    g.parts[0] = core::GemmPart{a.op, b.op, depth};
    CHECK(core::scaled_parts(g) == 1u && core::chunk_blocks(g, 1u) == 2 &&
          core::chunk_blocks(g, 0) == (depth + 63) / 64);
    core::MmaBlock block = core::chunk_block(g, 3, 1, 1u);  // rows 128 to 149 (22 of 128), columns 128 and 129
    CHECK(block.scaled && block.k0 == core::kScaledDepth && block.row0 == 128 && block.col0 == 128);
    std::vector<uint8_t> panels(2 * kPanelValues * sizeof(core::bf16_t), 0x7f), atoms(2 * core::kScaleAtomBytes, 0xff);
    int copies = 0;
    bool exact = true;
    for (int p = 0; p < core::kBlockPieces; ++p) core::fill_codes(g, block, p, panels.data(), CountedMove{&copies});
    for (int w = 0; w < core::kScaleWords; ++w) exact = core::fill_scales(g, block, w, atoms.data()) && exact;
    // Whole pieces: depth 256, 22 rows of a and 2 of b, each the block's 8; depth 200, the even rows (200 bytes apart:
    // every other one on 16 bytes), 11 of a and 1 of b, each the 4 pieces inside the depth (k0 128 to 191).
    int whole = depth % 16 == 0 ? (22 + 2) * core::kCodePieces : (11 + 1) * 4;
    CHECK_MSG(copies == whole && exact, "depth %d: %d pieces copied whole, not %d", depth, copies, whole);
    long long wrong = 0;
    for (int second = 0; second < 2; ++second) {
      const Stored& o = second ? b : a;
      int rows = second ? g.cols : g.rows, row0 = second ? block.col0 : block.row0;
      const uint8_t* panel = panels.data() + second * kPanelValues * sizeof(core::bf16_t);
      const uint8_t* atom = atoms.data() + second * core::kScaleAtomBytes;
      for (int r = 0; r < kMmaRows; ++r) {
        bool inside = row0 + r < rows;
        for (int k = 0; k < core::kScaledDepth; ++k) {
          int at = block.k0 + k;
          uint8_t code = inside && at < depth ? o.codes[static_cast<size_t>(row0 + r) * depth + at] : 0;
          wrong += panel[core::code_offset(r, k)] != code;
        }
        for (int s = 0; s < core::kScaleBlocks; ++s) {
          int64_t at = block.k0 / core::kMxBlock + s;
          uint8_t scale =
              inside && at < core::mx_blocks(depth) ? core::operand_scale(o.op, row0 + r, at) : core::kMxPadScale;
          wrong += atom[core::scale_offset(r, s)] != scale;
        }
      }
    }
    CHECK_MSG(wrong == 0, "depth %d: %lld codes or scales not the operand's", depth, wrong);
  }
}

// A scaled block's values are judged by its scales (core::exact_scale): under every scale in the range, every e4m3
// code's value is a finite bf16, normal or 0 (what the bf16 route asks of each value, and no subnormal product for the
// MMA); one step past either end, some code's is not (2^-127 at the least code and scale 2^-118; infinity at 448 x
// 2^120).
TEST(a_scaled_blocks_scales_judge_its_values) {
  auto all_normal_bf16 = [](int scale) {
    for (int code = 0; code < 256; ++code) {
      if ((code & 0x7f) == 0x7f) continue;  // e4m3's NaN
      bool exact = true;
      float value = core::mx_value(static_cast<uint8_t>(code), core::e8m0_decode(static_cast<uint8_t>(scale)));
      core::tensor_value(value, exact);
      if (!exact || !std::isfinite(value) || (value != 0.0f && std::fabs(value) < 0x1p-126f)) return false;
    }
    return true;
  };
  int judged = 0;
  for (int scale = 0; scale < 255; ++scale)
    if (core::exact_scale(static_cast<uint8_t>(scale))) {
      CHECK_MSG(all_normal_bf16(scale), "scale 2^%d: a code's value is no normal bf16", scale - 127);
      ++judged;
    }
  CHECK_MSG(judged == 237 && !all_normal_bf16(core::kExactScaleLeast - 1) &&
                !all_normal_bf16(core::kExactScaleMost + 1) && !core::exact_scale(255),
            "%d scales judged exact", judged);
}

// Tensor cores that stop (an MMA that never finishes): the wait that needs it runs out, sum_tile says so, and the
// stages it leaves busy are every stage with MMAs still to run, which tensor_tile::close waits for once more before
// it frees the tensor memory. Once the tensor cores go on (slow, not dead), those waits pass and nothing is left.
TEST(a_wait_that_runs_out_leaves_busy_every_stage_with_mmas_still_to_run) {
  std::mt19937_64 rng(seed() + 9);
  int stalled = 0;
  for (int n = 0; n < 24; ++n) {
    TileCase t;
    make_case(t, rng);
    EmulatedCta cta(rng);
    cta.start(t.g);
    int mmas = core::tensor_chunks(t.g) * core::chunk_blocks(t.g, 0);
    cta.stall = static_cast<int>(rng() % std::min(6, mmas));  // before the last MMA, which the last drain waits for
    core::PanelStages stages;
    bool summed = core::sum_tile(t.g, stages, cta);
    CHECK_MSG(cta.error.empty(), "%s: %s", t.text.c_str(), cta.error.c_str());
    CHECK_MSG(!summed, "%s: every chunk summed past a stall at MMA %d of %d", t.text.c_str(), cta.stall, mmas);
    stalled += !summed;
    CHECK_MSG(!cta.queued.empty(), "%s: a wait ran out with no MMA to run", t.text.c_str());
    for (const auto& job : cta.queued)
      CHECK_MSG(stages.busy(job.stage), "%s: stage %d has MMAs to run but is not busy", t.text.c_str(), job.stage);
    cta.stall = -1;
    CHECK(core::wait_busy(stages, cta));  // as tensor_tile::close
    CHECK_MSG(cta.queued.empty(), "%s: %zu MMAs left after close's waits", t.text.c_str(), cta.queued.size());
  }
  CHECK_MSG(stalled == 24, "only %d of 24 tiles stalled", stalled);
}

// Another thread's wait runs out (the vote of a sync fails at a step drawn at random), or this thread's wait for a TMA
// load (a land fails at a block drawn at random): sum_tile stops with none of this thread's copies in flight, and the
// stages as the last vote that passed left them (a wait this thread passed since is not marked, as for the thread whose
// wait ran out), so close's waits drain every MMA.
TEST(a_vote_or_a_load_lost_leaves_no_copies_in_flight) {
  std::mt19937_64 rng(seed() + 10);
  for (int n = 0; n < 24; ++n) {
    TileCase t;
    make_case(t, rng);
    EmulatedCta cta(rng);
    cta.start(t.g);
    // A block's, and each chunk's when its last MMAs are done (the last chunk's in the drain).
    int syncs = core::tensor_chunks(t.g) * (core::chunk_blocks(t.g, 0) + 1);
    int blocks = core::tensor_chunks(t.g) * core::chunk_blocks(t.g, 0);  // a land each
    bool by_land = n % 2;
    (by_land ? cta.lose_land : cta.refuse) = static_cast<int>(rng() % (by_land ? blocks : syncs));
    core::PanelStages stages;
    bool summed = core::sum_tile(t.g, stages, cta);
    CHECK_MSG(cta.error.empty(), "%s: %s", t.text.c_str(), cta.error.c_str());
    CHECK_MSG(!summed, "%s: no %s lost at %d of %d", t.text.c_str(), by_land ? "land" : "vote",
              by_land ? cta.lose_land : cta.refuse, by_land ? blocks : syncs);
    CHECK_MSG(cta.flying.empty(), "%s: %zu groups of copies in flight after a lost vote", t.text.c_str(),
              cta.flying.size());
    for (int stage = 0; stage < core::kPanelStages; ++stage)
      if (cta.waited_since_vote >> stage & 1u)
        CHECK_MSG(stages.busy(stage), "%s: stage %d marked waited without a vote", t.text.c_str(), stage);
    CHECK(core::wait_busy(stages, cta));  // as tensor_tile::close
    CHECK_MSG(cta.queued.empty(), "%s: %zu MMAs left after close's waits", t.text.c_str(), cta.queued.size());
  }
}

// A bf16 operand's pieces go to its panel whole, in its own major, where its storage puts them on 16 bytes: a piece of
// a K-major one is 8 values along a row, an MN-major one's 8 rows of one k. Rows 0 to 127 of a 200-row operand, 64 deep
// from k = 64: every piece one copy, on 16 bytes (1024 of a's panel, 1024 of b's); an MN-major one whose k are 201
// values (402 bytes) apart, only every eighth k's (256). Each value where panel_offset puts it.
TEST(pieces_on_16_bytes_are_copied_whole_in_either_major) {
  std::mt19937_64 rng(seed() + 11);
  for (bool mn : {false, true})
    for (bool aligned : {true, false}) {
      if (!mn && !aligned) continue;  // a K-major row's 128 depth start every 256 bytes
      Stored a, b;
      make_operand(a, false, mn, 200, 128, rng, mn ? (aligned ? 208 : 201) : 128);
      b = a;
      b.op.data = b.bf16.data();
      core::Gemm g{};
      g.rows = g.cols = 200;
      g.num_parts = 1;
      g.parts[0] = core::GemmPart{a.op, b.op, 128};
      std::vector<core::bf16_t> panels(2 * kPanelValues, core::bf16_t(0x7fc0));
      int copies = 0;
      bool exact = true;
      core::MmaBlock block = core::chunk_block(g, 0, 1, 0);
      for (int p = 0; p < core::kBlockPieces; ++p)
        core::fill_piece(g, block, p, panels.data(), exact, CountedMove{&copies});
      const char* name = mn ? (aligned ? "MN-major on 16 bytes" : "MN-major off 16 bytes") : "K-major";
      CHECK_MSG(copies == (aligned ? core::kBlockPieces : core::kBlockPieces / 8), "%s: %d of %d pieces copied whole",
                name, copies, core::kBlockPieces);
      core::PanelMajor major = mn ? core::PanelMajor::mn : core::PanelMajor::k;
      CHECK(core::panel_major(a.op) == major && exact);
      long long wrong = 0;
      for (int panel = 0; panel < 2; ++panel)
        for (int i = 0; i < kMmaRows; ++i)
          for (int k = 0; k < kMmaDepth; ++k)
            wrong += core::bf16_to_float(panels[panel * kPanelValues + core::panel_offset(major, i, k)]) !=
                     core::stored_value(a.op, i, kMmaDepth + k);
      CHECK_MSG(wrong == 0, "%s: %lld panel values are not the operand's", name, wrong);
    }
}

namespace {

struct BoxCounts {
  int blocks = 0, refused = 0;
};

// Every block of `g`: each operand a tensor map takes filled by TMA's boxes, as the device would, holds every byte of
// fill_piece's panel (the threads' fill), and its boxes write each of the panel's values once.
void check_boxes(const core::Gemm& g, const std::string& text, BoxCounts& counts) {
  for (int chunk = 0; chunk < core::tensor_chunks(g); ++chunk)
    for (int block = 0; block < core::chunk_blocks(g, 0); ++block) {
      core::MmaBlock b = core::chunk_block(g, chunk, block, 0);
      std::vector<core::bf16_t> pieces(2 * kPanelValues, core::bf16_t(0x7fc0));
      bool exact = true;
      for (int p = 0; p < core::kBlockPieces; ++p) core::fill_piece(g, b, p, pieces.data(), exact);
      for (int second = 0; second < 2; ++second) {
        std::vector<core::bf16_t> boxed(kPanelValues, core::bf16_t(0x7fa0));  // another NaN than the pieces'
        std::vector<int> written(kPanelValues, 0);
        if (!load_panel(g, b, second, boxed.data(), &written)) {
          ++counts.refused;
          continue;
        }
        ++counts.blocks;
        long long wrong = 0, not_once = 0;
        for (int v = 0; v < kPanelValues; ++v) {
          wrong += boxed[v] != pieces[second * kPanelValues + v];
          not_once += written[v] != 1;
        }
        if (wrong || not_once) {
          CHECK_MSG(false,
                    "%s: chunk %d block %d, %s's panel: %lld values differ from fill_piece's, %lld not written "
                    "once",
                    text.c_str(), chunk, block, second ? "b" : "a", wrong, not_once);
          return;
        }
      }
    }
}

}  // namespace

// The panels TMA's tensor loads would fill (core/panel_boxes.hpp), byte for byte the threads' (fill_piece, whose
// layout test_tensor_tile_cute holds against CuTe's MMA): bf16 operands K- and MN-major, rows and depth that end
// inside a panel (the map's bounds give its zeros), rows padded with NaN past the depth (K-major) or the rows
// (MN-major), which a map as wide as the storage would read. Operands TMA cannot take (e4m3, a stride off 16 bytes, a
// base off 16 bytes) are refused, for the threads to fill.
TEST(tma_boxes_fill_the_panels_as_the_threads_do) {
  std::mt19937_64 rng(seed() + 12);
  BoxCounts counts;
  for (int round = 0; round < 40; ++round) {
    bool mn = round % 2, e4m3 = round % 8 == 7;
    int rows = 1 + static_cast<int>(rng() % 300), cols = 1 + static_cast<int>(rng() % 300);
    int depth = 1 + static_cast<int>(rng() % 200);
    int across = mn ? std::max(rows, cols) : depth;  // the storage's contiguous extent
    int lead = across + static_cast<int>(rng() % 3 == 0 ? rng() % 3 : (8 - across % 8) % 8 + 8 * (rng() % 2));
    Stored a, b;
    make_operand(a, e4m3, mn, rows, depth, rng, lead);
    make_operand(b, false, !mn, cols, depth, rng, ((mn ? depth : cols) + 7) / 8 * 8 + 8);  // padded, on 16 bytes
    core::Gemm g{};
    g.rows = rows;
    g.cols = cols;
    g.num_parts = 1;
    g.parts[0] = core::GemmPart{a.op, b.op, depth};
    std::string text = std::to_string(rows) + "x" + std::to_string(cols) + " depth " + std::to_string(depth) +
                       (mn ? ", a MN-major" : ", a K-major") + (e4m3 ? " e4m3" : "") + " lead " + std::to_string(lead);
    core::PanelMap map{};
    bool takes = core::panel_map(a.op, rows, depth, &map);
    bool should = !e4m3 && lead % 8 == 0;
    CHECK_MSG(takes == should, "%s: a's map %s", text.c_str(), takes ? "made" : "refused");
    check_boxes(g, text, counts);
  }
  std::vector<core::bf16_t> values(64, 0x3f80);
  core::PanelMap map{};
  CHECK_MSG(!core::panel_map(core::bf16_operand(values.data() + 1, 16, 1, false), 2, 16, &map),
            "a base off 16 bytes is refused");
  CHECK_MSG(core::panel_map(core::bf16_operand(values.data(), 16, 1, false), 2, 16, &map),
            "a base on 16 bytes is taken");
  CHECK_MSG(counts.blocks > 200 && counts.refused > 20, "%d panels by boxes, %d refused", counts.blocks,
            counts.refused);
}

// What the tensor cores cannot take stays with gemm_element: an MXFP8 round trip on read, an fp32 operand, no depth.
TEST(tensor_gemm_refuses_what_the_tensor_cores_cannot_take) {
  std::vector<core::bf16_t> x(64, 0x3f80);
  std::vector<float> f(64, 1.0f);
  core::Operand bf = core::bf16_operand(x.data(), 8, 1, false);
  core::Gemm g{};
  g.rows = g.cols = 8;
  g.num_parts = 1;
  g.parts[0] = core::GemmPart{bf, bf, 8};
  CHECK(core::tensor_gemm(g));
  g.parts[0].a.quantize = true;
  CHECK(!core::tensor_gemm(g));
  g.parts[0].a = bf;
  g.parts[0].b.dtype = core::Dtype::f32;
  g.parts[0].b.data = f.data();
  CHECK(!core::tensor_gemm(g));
  g.parts[0].b = bf;
  g.parts[0].depth = 0;
  CHECK(!core::tensor_gemm(g));
}

MOK_TEST_MAIN
