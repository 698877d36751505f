#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "nxd/runtime/error.h"
#include "nxd/train_app/corpus.h"
#include "support/files.h"

using namespace nxd;
using namespace nxd::trainer;
using namespace nxd::train_app;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir() {
  return nxd::testing::test_temp_dir("nxd_data_test_");
}

void write(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
}

std::shared_ptr<Corpus> corpus_of(const std::string& text) {
  auto c = std::make_shared<Corpus>();
  for (unsigned char ch : text) c->tokens.push_back(ch);
  return c;
}

}  // namespace

TEST(Data, IsText) {
  std::string why;
  EXPECT_TRUE(is_text("plain ascii\n", &why));
  EXPECT_TRUE(is_text("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", &why));
  EXPECT_FALSE(is_text(std::string("ab\0c", 4), &why));
  EXPECT_EQ(why, "binary: NUL byte at offset 2");
  EXPECT_FALSE(is_text("abc\xff", &why));
  EXPECT_EQ(why, "not text: invalid UTF-8 at offset 3");
  EXPECT_FALSE(is_text("\xc0\xaf", &why));      // overlong '/'
  EXPECT_FALSE(is_text("\xe2\x82", &why));      // truncated
  EXPECT_FALSE(is_text("\xed\xa0\x80", &why));  // surrogate
}

TEST(Data, FolderReadsTextSortedSkipsBinaryAndDuplicates) {
  auto d = temp_dir();
  write(d / "b.txt", "BBB");
  write(d / "a.txt", "AAA");
  write(d / "sub" / "c", "CC");
  write(d / "a.dat", std::string("\x00\x01\x02", 3));
  write(d / "latin1.txt", "caf\xe9");
  fs::create_symlink(d / "a.txt", d / "a.u8");
  Corpus c = load_text_corpus(d.string());
  std::string text(c.tokens.begin(), c.tokens.end());
  EXPECT_EQ(text, "AAABBBCC");  // a.txt, b.txt, sub/c in path order
  EXPECT_EQ(c.vocab_size, 256);
  ASSERT_EQ(c.files.size(), 3u);
  std::set<std::string> skipped;
  for (const auto& s : c.skipped)
    skipped.insert(fs::path(s.path).filename().string() + " " + s.reason.substr(0, 9));
  EXPECT_EQ(skipped,
            (std::set<std::string>{"a.dat binary: N", "latin1.txt not text:", "a.u8 duplicate"}))
      << ::testing::PrintToString(skipped);
}

TEST(Data, MissingPathAndEmptyCorpus) {
  auto d = temp_dir();
  try {
    load_text_corpus((d / "nope").string());
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos) << e.what();
  }
  write(d / "x.dat", std::string("\0\0", 2));
  try {
    load_text_corpus(d.string());
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("empty corpus"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("x.dat"), std::string::npos) << e.what();
  }
}

TEST(Data, TokenFiles) {
  auto d = temp_dir();
  // uint16 little-endian 1, 258, 7
  write(d / "t16.bin", std::string("\x01\x00\x02\x01\x07\x00", 6));
  Corpus c = load_token_file((d / "t16.bin").string(), 2, 300);
  EXPECT_EQ(c.tokens, (std::vector<uint32_t>{1, 258, 7}));
  write(d / "t32.bin", std::string("\x01\x00\x01\x00\x05\x00\x00\x00", 8));
  c = load_token_file((d / "t32.bin").string(), 4, 70000);
  EXPECT_EQ(c.tokens, (std::vector<uint32_t>{65537, 5}));
  EXPECT_THROW(load_token_file((d / "t16.bin").string(), 2, 258), ConfigError);  // id 258
  write(d / "odd.bin", std::string("\x01\x00\x02", 3));
  EXPECT_THROW(load_token_file((d / "odd.bin").string(), 2, 300), ConfigError);
}

TEST(Data, WindowsAndBatches) {
  // 10 tokens, S = 3: samples [0..3], [3..6], [6..9]
  auto corpus = corpus_of("0123456789");
  auto ds = std::make_shared<CorpusDataset>(corpus, 3);
  EXPECT_EQ(ds->size(), 3);
  Batch b = make_batch(*ds, {2, 0});
  EXPECT_EQ(b.ids.shape(), (Shape{2, 3}));
  EXPECT_EQ(b.ids.dtype(), DType::i64);
  EXPECT_EQ(b.ids.to_vector_as<int64_t>(), (std::vector<int64_t>{'6', '7', '8', '0', '1', '2'}));
  EXPECT_EQ(b.targets.to_vector_as<int64_t>(),
            (std::vector<int64_t>{'7', '8', '9', '1', '2', '3'}));
  EXPECT_THROW(CorpusDataset(corpus_of("abc"), 3), ConfigError);
}

TEST(Data, SplitIsDisjointCompleteAndSeeded) {
  auto base = std::make_shared<RandomDataset>(1000, 4, 256, 1);
  Split s = split_dataset(base, 0.1, 42);
  ASSERT_TRUE(s.val);
  EXPECT_EQ(s.val->size(), 100);
  EXPECT_EQ(s.train->size(), 900);
  auto vi = std::dynamic_pointer_cast<const SubsetDataset>(s.val)->indices();
  auto ti = std::dynamic_pointer_cast<const SubsetDataset>(s.train)->indices();
  std::set<int64_t> all(vi.begin(), vi.end());
  all.insert(ti.begin(), ti.end());
  EXPECT_EQ(all.size(), 1000u);
  EXPECT_EQ(
      std::dynamic_pointer_cast<const SubsetDataset>(split_dataset(base, 0.1, 42).val)->indices(),
      vi);
  EXPECT_NE(
      std::dynamic_pointer_cast<const SubsetDataset>(split_dataset(base, 0.1, 43).val)->indices(),
      vi);
  // the held-out samples are spread over the corpus, not its tail
  EXPECT_LT(vi.front(), 100);
  EXPECT_GT(vi.back(), 900);
  Split none = split_dataset(base, 0.0, 42);
  EXPECT_FALSE(none.val);
  EXPECT_EQ(none.train->size(), 1000);
}

TEST(Data, SamplerCoversEverySampleOncePerEpochAcrossRanks) {
  const int64_t n = 103;
  for (int64_t dp : {1, 2, 4}) {
    std::multiset<int64_t> seen;
    for (int64_t r = 0; r < dp; ++r) {
      DistributedSampler s(n, {7, true, r, dp});
      auto idx = s.indices(0);
      EXPECT_EQ(static_cast<int64_t>(idx.size()), n / dp);
      seen.insert(idx.begin(), idx.end());
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), n / dp * dp);
    EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), seen.size()) << "dp " << dp;
  }
  DistributedSampler s(n, {7, true, 0, 1});
  EXPECT_NE(s.indices(0), s.indices(1));  // a new order each epoch
  EXPECT_EQ(s.indices(1), DistributedSampler(n, {7, true, 0, 1}).indices(1));
  DistributedSampler plain(5, {7, false, 1, 2});
  EXPECT_EQ(plain.indices(3), (std::vector<int64_t>{1, 3}));
}

// A global batch of 8 in micro batches of 2, split between DP and accumulation (DP 1 x 4, DP 2 x
// 2, DP 4 x 1): every step's micro batches hold the same samples in every split (what keeps MoE's
// per-micro-batch auxiliary loss independent of the layout), over two epochs of 103 samples (an
// epoch is 12 whole global batches, 7 samples dropped, in every split). Torch's sampler (one
// position at a time, epochs of whole micro batches per rank) groups them differently.
TEST(Data, MicroBatchesHoldTheSameSamplesWhateverTheSplitOfTheGlobalBatch) {
  const int64_t n = 103, b = 2, global = 8, steps = 24;
  // step -> its micro batches (each the samples in order), over every rank and accumulation step
  auto micro_batches = [&](int64_t dp) {
    std::vector<std::multiset<std::vector<int64_t>>> out(steps);
    const int64_t accum = global / (b * dp);
    for (int64_t r = 0; r < dp; ++r) {
      DistributedSampler s(
          n, {.seed = 7, .dp_rank = r, .dp_size = dp, .micro_batch = b, .accumulation = accum});
      EXPECT_EQ(s.global_batch(), global);
      const int64_t per_epoch = s.samples_per_rank() / b;
      EXPECT_EQ(per_epoch, 12 * accum) << "dp " << dp;
      for (int64_t j = 0; j < steps * accum; ++j) {
        const auto idx = s.indices(j / per_epoch);
        const int64_t k = j % per_epoch * b;
        out[j / accum].insert(std::vector<int64_t>(idx.begin() + k, idx.begin() + k + b));
      }
    }
    return out;
  };
  const auto one = micro_batches(1);
  std::set<int64_t> first_epoch;
  for (int64_t st = 0; st < steps / 2; ++st)
    for (const auto& m : one[st]) first_epoch.insert(m.begin(), m.end());
  EXPECT_EQ(first_epoch.size(), 96u);  // every sample once (7 dropped)
  for (int64_t dp : {2, 4}) {
    const auto split = micro_batches(dp);
    for (int64_t st = 0; st < steps; ++st)
      EXPECT_EQ(split[st], one[st]) << "dp " << dp << " step " << st;
  }
  // torch's DistributedSampler at DP 4: rank 0's first micro batch is positions 0 and 4
  const auto torch0 = DistributedSampler(n, {.seed = 7, .dp_size = 4}).indices(0);
  EXPECT_EQ(one[0].count(std::vector<int64_t>{torch0[0], torch0[1]}), 0u);
  // the DataLoader takes its micro batch's positions at once: DP 4's rank 1 = one rank's second
  auto ds = std::make_shared<RandomDataset>(n, 4, 256, 3);
  DataLoader l1(ds, b, {.seed = 7, .accumulation = 4});
  DataLoader l4(ds, b, {.seed = 7, .dp_rank = 1, .dp_size = 4});
  l1.next();
  EXPECT_EQ(l4.next().ids.to_vector_as<int64_t>(), l1.next().ids.to_vector_as<int64_t>());
  EXPECT_EQ(l1.batches_per_epoch(), 48);
  EXPECT_EQ(l4.batches_per_epoch(), 12);
}

TEST(Data, LoaderWrapsEpochsAndRestoresState) {
  auto ds = std::make_shared<RandomDataset>(10, 4, 256, 3);
  DataLoader a(ds, 3, {5, true, 0, 1});
  EXPECT_EQ(a.batches_per_epoch(), 3);  // the 10th sample is dropped each epoch
  std::vector<std::vector<int64_t>> seq;
  for (int i = 0; i < 7; ++i) seq.push_back(a.next().ids.to_vector_as<int64_t>());
  EXPECT_EQ(a.epoch(), 2);
  EXPECT_EQ(a.position(), 1);
  DataLoader b(ds, 3, {5, true, 0, 1});
  b.set_state(1, 2);
  EXPECT_EQ(b.next().ids.to_vector_as<int64_t>(), seq[5]);
  EXPECT_EQ(b.next().ids.to_vector_as<int64_t>(), seq[6]);
  EXPECT_THROW(DataLoader(ds, 11, {5, true, 0, 1}), ConfigError);
}

TEST(Data, RandomDatasetIsDeterministicAndInRange) {
  RandomDataset r(50, 16, 1000, 9);
  std::vector<int64_t> x(17), y(17);
  r.get(3, x.data());
  RandomDataset(50, 16, 1000, 9).get(3, y.data());
  EXPECT_EQ(x, y);
  for (int64_t v : x) EXPECT_TRUE(v >= 0 && v < 1000);
  RandomDataset(50, 16, 1000, 10).get(3, y.data());
  EXPECT_NE(x, y);
}

TEST(Data, FortunesCorpusIsReadable) {
  if (!fs::exists("/usr/share/games/fortunes")) GTEST_SKIP() << "fortunes is not installed";
  Corpus c = load_text_corpus("/usr/share/games/fortunes");
  EXPECT_GT(c.tokens.size(), 1000000u);
  for (const auto& f : c.files) EXPECT_EQ(fs::path(f).extension(), "") << f;
  for (const auto& s : c.skipped)
    EXPECT_TRUE(fs::path(s.path).extension() == ".dat" || fs::path(s.path).extension() == ".u8")
        << s.path << ": " << s.reason;
}
