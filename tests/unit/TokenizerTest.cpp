//===- TokenizerTest.cpp - WordPiece tokenizer against Hugging Face tokenizers -===//
//
// Golden ids from the `tokenizers` library (tests/golden/tokenizer/make_tokenizer_golden.py) on the
// STS-B and BLiMP sentences of ../shared/data with the BERT-base uncased and T-TA vocabularies, cased
// and uncased; a Unicode torture set; malformed vocabularies; the C API; the vocabulary builder.
//
//===----------------------------------------------------------------------===//
#include "runtime/lib/Tokenizer.h"
#include "runtime/lib/lmrt.h"
#include "tests/unit/TestPaths.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

using namespace lmcc;
namespace fs = std::filesystem;

namespace {

const fs::path kSource = test::kSourceDir;
const fs::path kData = kSource / ".." / "shared" / "data";
const fs::path kFixtures = kSource / "tests" / "golden" / "tokenizer" / "fixtures";

std::string readGz(const fs::path &path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f)
    throw std::runtime_error("cannot open " + path.string());
  std::string out;
  char buf[65536];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0)
    out.append(buf, size_t(n));
  gzclose(f);
  return out;
}

std::string readFile(const fs::path &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> split(const std::string &s, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    size_t end = s.find(sep, pos);
    out.push_back(s.substr(pos, end == std::string::npos ? std::string::npos : end - pos));
    if (end == std::string::npos)
      return out;
    pos = end + 1;
  }
}

/// The sentences make_tokenizer_golden.py tokenized, in its order.
std::vector<std::string> goldenSentences() {
  std::vector<std::string> out;
  auto dev = split(readFile(kData / "stsb" / "dev.tsv"), '\n');
  for (size_t i = 1; i < dev.size(); ++i) {
    auto cols = split(dev[i], '\t');
    if (cols.size() >= 10)
      out.push_back(cols[7]), out.push_back(cols[8]);
  }
  for (const std::string &line : split(readFile(kData / "stsb" / "test.tsv"), '\n')) {
    auto cols = split(line, '\t');
    if (cols.size() >= 7)
      out.push_back(cols[5]), out.push_back(cols[6]);
  }
  std::vector<fs::path> blimp;
  for (const auto &e : fs::directory_iterator(kData / "blimp"))
    if (e.path().string().size() > 9 && e.path().string().substr(e.path().string().size() - 9) == ".jsonl.gz" &&
        e.path().filename().string().rfind("models_summary", 0) != 0)
      blimp.push_back(e.path());
  std::sort(blimp.begin(), blimp.end());
  for (const fs::path &p : blimp) {
    auto lines = split(readGz(p), '\n');
    for (size_t i = 0; i < 20 && i < lines.size(); ++i) {
      auto row = nlohmann::json::parse(lines[i]);
      out.push_back(row["sentence_good"]), out.push_back(row["sentence_bad"]);
    }
  }
  return out;
}

struct Config {
  const char *tag, *vocab;
  bool lowercase;
};
const Config kConfigs[] = {{"bert-uncased", "bert-base-uncased/vocab.txt", true},
                           {"bert-cased", "bert-base-uncased/vocab.txt", false},
                           {"tta-uncased", "tta/vocab-lower.sub-32k.txt", true},
                           {"tta-cased", "tta/vocab-lower.sub-32k.txt", false}};

Tokenizer load(const Config &c) {
  std::string text = readFile(kData / c.vocab);
  return Tokenizer::fromText(text, c.vocab, c.lowercase, Tokenizer::conventionalSpecials(text, c.vocab));
}

std::string join(const std::vector<int32_t> &ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i)
    s += (i ? " " : "") + std::to_string(ids[i]);
  return s;
}

std::string unhex(const std::string &hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(char(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

#define REQUIRE_DATA()                                                                                             \
  if (!fs::exists(kData / "bert-base-uncased" / "vocab.txt"))                                                     \
  GTEST_SKIP() << "no " << kData << " (the shared evaluation data)"

} // namespace

TEST(GoldenTokenizer, StsbAndBlimpMatchHuggingFace) {
  REQUIRE_DATA();
  std::vector<std::string> sentences = goldenSentences();
  ASSERT_EQ(sentences.size(), 8438u);
  for (const Config &c : kConfigs) {
    Tokenizer tok = load(c);
    auto expected = split(readGz(kFixtures / (std::string(c.tag) + ".ids.gz")), '\n');
    ASSERT_EQ(expected.size(), sentences.size() + 1) << c.tag; // final newline
    int mismatches = 0;
    for (size_t i = 0; i < sentences.size(); ++i) {
      std::string got = join(tok.encodeSentence(sentences[i]));
      if (got != expected[i] && ++mismatches <= 5)
        ADD_FAILURE() << c.tag << " sentence " << i << ": \"" << sentences[i] << "\"\n  lmcc: " << got
                      << "\n  HF:   " << expected[i];
    }
    EXPECT_EQ(mismatches, 0) << c.tag;
  }
}

TEST(GoldenTokenizer, UnicodeTortureSet) {
  REQUIRE_DATA();
  auto golden = nlohmann::json::parse(readFile(kFixtures / "torture.json"));
  const size_t valid = golden["valid"];
  for (const Config &c : kConfigs) {
    Tokenizer tok = load(c);
    const auto &ids = golden["ids"][c.tag];
    for (size_t i = 0; i < golden["texts"].size(); ++i) {
      std::string text = unhex(golden["texts"][i]);
      if (i < valid) {
        EXPECT_EQ(join(tok.encodeSentence(text)), join(ids[i].get<std::vector<int32_t>>()))
            << c.tag << " torture text " << i << ": " << text;
      } else {
        try {
          tok.encodeSentence(text, "t.txt:7");
          ADD_FAILURE() << "invalid UTF-8 accepted: " << golden["texts"][i];
        } catch (const TokenizerError &e) {
          EXPECT_NE(std::string(e.what()).find("t.txt:7: invalid UTF-8 at byte "), std::string::npos) << e.what();
        }
      }
    }
  }
}

namespace {
const SpecialIds kToySpecials{0, 1, 2, 3, 4};
const char *kToyVocab = "[PAD]\n[EOS]\n[UNK]\n[SOS]\n[MASK]\nun\n##aff\n##able\nhello\n,\n!\ncafe\n";

std::string vocabError(const std::string &text) {
  try {
    Tokenizer::fromText(text, "v.txt", true, kToySpecials);
  } catch (const TokenizerError &e) {
    return e.what();
  }
  return "no error";
}
} // namespace

TEST(Tokenizer, WordPieceGreedyLongestMatch) {
  Tokenizer tok = Tokenizer::fromText(kToyVocab, "v.txt", true, kToySpecials);
  EXPECT_EQ(join(tok.encodeSentence("Unaffable, hello!")), "3 5 6 7 9 8 10 1");
  EXPECT_EQ(join(tok.encode("unaffablex")), "2");          // unmatched suffix: the whole word is unk
  EXPECT_EQ(join(tok.encode("CAFÉ [MASK]")), "11 4");      // accents stripped; specials kept whole
  EXPECT_EQ(join(tok.encode("hello[EOS]hello")), "8 1 8"); // specials split words
  EXPECT_EQ(tok.piece(6), "##aff");
  EXPECT_EQ(tok.find("nope"), -1);
  Tokenizer cased = Tokenizer::fromText(kToyVocab, "v.txt", false, kToySpecials);
  EXPECT_EQ(join(cased.encode("CAFÉ cafe")), "2 11");
}

TEST(Tokenizer, MalformedVocabulariesNameTheLine) {
  EXPECT_EQ(vocabError(""), "v.txt: empty vocabulary");
  EXPECT_EQ(vocabError("[PAD]\n[EOS]\n\n[SOS]\n[MASK]\n"), "v.txt:3: empty line (every line must hold one token)");
  EXPECT_EQ(vocabError("[PAD]\n[EOS]\n[UNK]\n[SOS]\n[MASK]\nab\nab\n"),
            "v.txt:7: duplicate token \"ab\" (first on line 6)");
  EXPECT_EQ(vocabError("[PAD]\n[EOS]\n[UNK]\n[SOS]\n[MASK]\na\xff\n"), "v.txt:6: invalid UTF-8 at byte 1 (0xFF)");
  EXPECT_EQ(vocabError("[PAD]\n[EOS]\n[UNK]\n[SOS]\n[MASK]\na b\n"),
            "v.txt:6: token \"a b\" contains whitespace, which no word ever does");
  EXPECT_EQ(vocabError("[PAD]\n[EOS]\n[UNK]\n[SOS]\n"), "v.txt: the mask token id 4 is outside the vocabulary's 4 lines");
  try {
    Tokenizer::conventionalSpecials("[PAD]\n[UNK]\n[CLS]\n[SEP]\n", "v.txt");
    ADD_FAILURE() << "no error";
  } catch (const TokenizerError &e) {
    EXPECT_STREQ(e.what(), "v.txt: no mask token ([MASK]) in the vocabulary");
  }
}

TEST(Tokenizer, CApi) {
  fs::path vocab = fs::temp_directory_path() / ("lmcc-tok-" + std::to_string(::getpid()) + ".txt");
  {
    std::ofstream out(vocab);
    out << "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n##s\n";
  }
  lm_tokenizer *tok = nullptr;
  ASSERT_EQ(lm_tokenizer_load(vocab.c_str(), 1, &tok), LM_OK) << lm_last_error();
  int32_t ids[8];
  size_t n = 0;
  const char text[] = "Hello worlds";
  ASSERT_EQ(lm_tokenize(tok, text, sizeof text - 1, ids, 8, &n), LM_OK);
  EXPECT_EQ(join(std::vector<int32_t>(ids, ids + n)), "2 5 6 7 3");
  EXPECT_EQ(lm_tokenize(tok, text, sizeof text - 1, ids, 3, &n), LM_ERR_ARGUMENT);
  EXPECT_EQ(n, 5u);
  EXPECT_STREQ(lm_last_error(), "lm_tokenize: 5 ids do not fit in capacity 3");
  EXPECT_EQ(lm_tokenize(tok, "a\xc3", 2, ids, 8, &n), LM_ERR_ARGUMENT);
  EXPECT_STREQ(lm_last_error(), "lm_tokenize: invalid UTF-8 at byte 1 (0xC3)");
  EXPECT_STREQ(lm_token_piece(tok, 7), "##s");
  EXPECT_EQ(lm_token_piece(tok, 8), nullptr);
  EXPECT_EQ(lm_tokenizer_vocab_size(tok), 8);
  lm_tokenizer_free(tok);
  EXPECT_EQ(lm_tokenizer_load("/nonexistent/vocab.txt", 1, &tok), LM_ERR_ARGUMENT);
  EXPECT_STREQ(lm_last_error(), "/nonexistent/vocab.txt: cannot open the vocabulary");
  EXPECT_EQ(tok, nullptr);
  fs::remove(vocab);
}

TEST(VocabBuilder, DeterministicAndCoversTheCorpus) {
  const std::string corpus = "The cat sat on the mat.\nThe cats sat; the dogs ran!\nCafé au lait, café noir.\n"
                             "running runners run\n";
  const std::vector<std::string> specials{"[PAD]", "[EOS]", "[UNK]", "[SOS]", "[MASK]"};
  auto a = buildWordPieceVocab(corpus, "c.txt", 80, true, specials);
  auto b = buildWordPieceVocab(corpus, "c.txt", 80, true, specials);
  EXPECT_EQ(a, b);
  ASSERT_GE(a.size(), 40u);
  EXPECT_LE(a.size(), 80u);
  EXPECT_EQ(std::vector<std::string>(a.begin(), a.begin() + 5), specials);
  EXPECT_NE(std::find(a.begin(), a.end(), "the"), a.end()); // the most frequent word is merged whole
  std::string text;
  for (const auto &p : a)
    text += p + "\n";
  Tokenizer tok = Tokenizer::fromText(text, "built", true, kToySpecials);
  for (int32_t id : tok.encode(corpus))
    EXPECT_NE(id, 2) << "unk in the corpus the vocabulary was built from";
  try {
    buildWordPieceVocab("ok\nbad \xff here\n", "c.txt", 50, true, specials);
    ADD_FAILURE() << "no error";
  } catch (const TokenizerError &e) {
    EXPECT_STREQ(e.what(), "c.txt:2: invalid UTF-8 at byte 4 (0xFF)");
  }
}

/// The vocabulary builder's merges by the definition, recounting every pair of every word after each merge
/// (ASCII lowercase words split on spaces; symbols as strings, "##" on non-initial ones): the builder updates its
/// counts incrementally, around the merged occurrences only, and must pick the same merges.
std::vector<std::string> wordPieceByDefinition(const std::string &corpus, size_t size,
                                               const std::vector<std::string> &specials) {
  std::map<std::string, int64_t> counts;
  std::istringstream in(corpus);
  for (std::string w; in >> w;)
    ++counts[w];
  std::vector<std::pair<std::vector<std::string>, int64_t>> words;
  std::set<char> alphabet;
  for (const auto &[w, c] : counts) {
    std::vector<std::string> parts;
    for (size_t i = 0; i < w.size(); ++i)
      parts.push_back((i ? "##" : "") + std::string(1, w[i])), alphabet.insert(w[i]);
    words.emplace_back(parts, c);
  }
  std::vector<std::string> vocab = specials;
  auto add = [&](const std::string &p) {
    if (std::find(vocab.begin(), vocab.end(), p) == vocab.end())
      vocab.push_back(p);
  };
  for (char c : alphabet)
    add(std::string(1, c)), add("##" + std::string(1, c));
  while (vocab.size() < size) {
    std::map<std::pair<std::string, std::string>, int64_t> pairs;
    for (const auto &[parts, c] : words)
      for (size_t i = 0; i + 1 < parts.size(); ++i)
        pairs[{parts[i], parts[i + 1]}] += c;
    const std::pair<std::string, std::string> *best = nullptr;
    int64_t bestCount = 1; // a pair must occur at least twice
    for (const auto &[p, c] : pairs) // in string order: the first of the most frequent wins ties
      if (c > bestCount)
        best = &p, bestCount = c;
    if (!best)
      break;
    const auto merge = *best;
    const std::string merged = merge.first + merge.second.substr(2);
    add(merged);
    for (auto &[parts, c] : words) {
      std::vector<std::string> next;
      for (size_t i = 0; i < parts.size(); ++i)
        if (i + 1 < parts.size() && parts[i] == merge.first && parts[i + 1] == merge.second)
          next.push_back(merged), ++i;
        else
          next.push_back(parts[i]);
      parts = next;
    }
  }
  return vocab;
}

TEST(VocabBuilder, MergesAsTheDefinition) {
  const std::vector<std::string> specials{"[PAD]", "[EOS]", "[UNK]", "[SOS]", "[MASK]"};
  // Runs of one letter (a merge of (a, ##a) leaves odd tails), alternations, and words of random length over a
  // small alphabet (many pairs per word, many words per pair).
  std::string corpus = "aaaaaaa aaa aa a aaaa abababab ababa baba aab aaab aaaab bbbbb bb abba abbba\n";
  uint64_t state = 12345;
  auto next = [&] { return (state = state * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
  for (int w = 0; w < 600; ++w) {
    const size_t length = 1 + next() % 40;
    for (size_t i = 0; i < length; ++i)
      corpus += char('a' + next() % 4);
    corpus += w % 10 == 9 ? '\n' : ' ';
  }
  for (size_t size : {20u, 60u, 200u, 2000u}) {
    SCOPED_TRACE(size);
    EXPECT_EQ(buildWordPieceVocab(corpus, "c.txt", int64_t(size), false, specials),
              wordPieceByDefinition(corpus, size, specials));
  }
}
