// Streamed output text with stop strings (text_stream.h).
#include "nxd/inference/text_stream.h"

#include <algorithm>

#include "nxd/io/tokenizer.h"

namespace nxd::inference {

namespace {

// The length of s without an unfinished UTF-8 character at its end.
size_t complete_utf8(const std::string& s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= std::min<size_t>(4, n); ++back) {
    const unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const size_t len = c < 0x80         ? 1
                       : (c >> 5) == 6  ? 2
                       : (c >> 4) == 14 ? 3
                       : (c >> 3) == 30 ? 4
                                        : 1;
    return len > back ? n - back : n;
  }
  return n;
}

}  // namespace

TextStream::TextStream(std::shared_ptr<const io::Tokenizer> tokenizer,
                       std::vector<std::string> stop)
    : tok_(std::move(tokenizer)), stop_(std::move(stop)) {}

std::string TextStream::push(const std::vector<int64_t>& ids) {
  if (!tok_ || stopped_) return {};
  int64_t left_out = 0;
  text_ += tok_->decode_model_output(ids, left_out);
  const size_t end = complete_utf8(text_);
  // the earliest stop string that appears in the text not yet output (and the longest stop
  // string's length before it, which may have been held back)
  size_t found = std::string::npos;
  for (const std::string& s : stop_) {
    const size_t from = emitted_ >= s.size() ? emitted_ - s.size() + 1 : 0;
    const size_t at = text_.find(s, from);
    if (at != std::string::npos) found = std::min(found, at);
  }
  if (found != std::string::npos) {
    stopped_ = true;
    std::string out = found > emitted_ ? text_.substr(emitted_, found - emitted_) : std::string();
    emitted_ = text_.size();
    return out;
  }
  // hold back the longest tail of the text that begins some stop string
  size_t hold = 0;
  for (const std::string& s : stop_)
    for (size_t k = std::min(s.size() - 1, end - emitted_); k > hold; --k)
      if (text_.compare(end - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  const size_t upto = end - hold;
  if (upto <= emitted_) return {};
  std::string out = text_.substr(emitted_, upto - emitted_);
  emitted_ = upto;
  return out;
}

std::string TextStream::flush() {
  if (stopped_ || emitted_ >= text_.size()) return {};
  std::string out = text_.substr(emitted_);
  const size_t end = complete_utf8(out);
  if (end < out.size()) out = out.substr(0, end) + "\xEF\xBF\xBD";
  emitted_ = text_.size();
  return out;
}

}  // namespace nxd::inference
