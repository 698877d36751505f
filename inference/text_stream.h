#pragma once
// A request's output text, streamed: the generated ids decoded as they come (byte-level BPE
// decodes id by id), stop strings searched in the text, and text held back while it may be the
// start of a stop string or ends inside a UTF-8 character.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace nxd::io {
class Tokenizer;
}

namespace nxd::inference {

class TextStream {
 public:
  // tokenizer null: no text (stop must be empty).
  TextStream(std::shared_ptr<const io::Tokenizer> tokenizer, std::vector<std::string> stop);
  // Appends the text of `ids`; returns the text that is now safe to output. Sets stopped() when a
  // stop string appears: the text before it is returned, nothing after.
  std::string push(const std::vector<int64_t>& ids);
  // The rest once the request has finished for another reason (held-back text; an unfinished
  // UTF-8 character becomes U+FFFD).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::shared_ptr<const io::Tokenizer> tok_;
  std::vector<std::string> stop_;
  std::string text_;
  size_t emitted_ = 0;
  bool stopped_ = false;
};

}  // namespace nxd::inference
