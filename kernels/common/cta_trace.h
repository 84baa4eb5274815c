// Diagnostics (bench --step-trace on the per-op decode path): every CTA of a traced launch appends one
// record of four words behind an atomic cursor: globaltimer ns at entry, when its PDL wait returned
// (0: not recorded), at exit, and sm | kind << 8 | layer << 16. Kinds follow the persistent step's
// phases: 0 qkv, 1 attention, 2 o-proj, 3 router, 4 FC1, 5 FC2. Off (buf null) it costs a branch.
#pragma once

namespace mx::cuda {

struct CtaTrace {
  unsigned long long* buf = nullptr;  // [cap][4]
  unsigned* cursor = nullptr;         // records appended so far (zeroed before the step)
  unsigned cap = 0;
  int layer = 0;
};

}  // namespace mx::cuda
