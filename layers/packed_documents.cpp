#include "nxd/layers/packed_documents.h"

#include "nxd/runtime/context.h"
#include "nxd/runtime/error.h"

namespace nxd {

namespace {
struct DocumentSlot {
  Tensor positions;
};
}  // namespace

DocumentScope::DocumentScope(const Tensor& positions) {
  DocumentSlot& s = current_context().ext<DocumentSlot>();
  prev_ = s.positions;
  if (positions.defined())
    NXD_CHECK_SHAPE(positions.dim() == 2, "[DocumentScope] positions must be [B, S], got ",
                    positions.desc());
  s.positions = positions.defined() ? positions.detach() : Tensor();
}

DocumentScope::~DocumentScope() {
  current_context().ext<DocumentSlot>().positions = prev_;
}

Tensor current_document_positions() {
  const DocumentSlot* s = current_context().find_ext<DocumentSlot>();
  return s ? s->positions : Tensor();
}

Tensor extend_document_positions(const Tensor& positions, int64_t length) {
  const int64_t b = positions.size(0), s = positions.size(1);
  NXD_CHECK_SHAPE(length >= s && s > 0, "[extend_document_positions] cannot extend ",
                  positions.desc(), " to length ", length);
  if (length == s) return positions;
  Tensor p = positions.to(DType::i64).contiguous();
  Tensor out = empty({b, length}, DType::i64);
  const int64_t* src = p.data<int64_t>();
  int64_t* dst = out.data<int64_t>();
  for (int64_t r = 0; r < b; ++r)
    for (int64_t i = 0; i < length; ++i)
      dst[r * length + i] = i < s ? src[r * s + i] : dst[r * length + i - 1] + 1;
  return out;
}

}  // namespace nxd
