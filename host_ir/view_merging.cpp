#include "host_ir/view_merging.h"

#include "host_ir/cast_forwarding.h"

namespace meshfuse {

namespace {

bool launchesView(const HostIrContainer& hic, const Instruction& ins) {
  return ins.kind == Instruction::Kind::LaunchSegment && hic.segments[ins.index].kind == Segment::Kind::View;
}

}  // namespace

void mergeAdjacentViews(const Fusion& fusion, HostIrContainer& hic) {
  std::vector<int> merged_into;  // the first segment of each run that took others
  for (size_t i = 0; i < hic.program.size();) {
    if (!launchesView(hic, hic.program[i])) {
      ++i;
      continue;
    }
    Segment& first = hic.segments[hic.program[i].index];
    size_t j = i + 1;
    for (; j < hic.program.size() && launchesView(hic, hic.program[j]); ++j) {
      Segment& later = hic.segments[hic.program[j].index];
      first.exprs.insert(first.exprs.end(), later.exprs.begin(), later.exprs.end());
      later.exprs.clear();
    }
    if (j > i + 1) merged_into.push_back(hic.program[i].index);
    i = j;
  }
  if (merged_into.empty()) return;
  const auto segments_of = segmentsOfExprs(hic.segments);
  for (int s : merged_into) collectInputsAndOutputs(fusion, hic.segments[s], segments_of, hic.segments);
  removeEmptySegments(hic);
}

}  // namespace meshfuse
