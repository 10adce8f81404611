// score.cpp - scores sentences with a model compiled by lmcc, through the C++ wrappers of its header.
//
// Written against a model named example_model; see README.md. Same usage and output as score.c:
//   ./score WEIGHTS.safetensors IDS.txt
#include "example_model.h"

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char **argv) {
  if (argc != 3) {
    std::cerr << "usage: " << argv[0] << " WEIGHTS.safetensors IDS.txt\n";
    return 2;
  }
  std::ifstream in(argv[2]);
  if (!in) {
    std::cerr << argv[2] << ": cannot open\n";
    return 1;
  }
  std::vector<std::vector<int32_t>> sentences;
  for (std::string line; std::getline(in, line);) {
    std::istringstream tokens(line);
    std::vector<int32_t> ids;
    for (int32_t id; tokens >> id;)
      ids.push_back(id);
    if (!tokens.eof()) { // stopped at something that is not an int32
      std::cerr << argv[2] << ": sentence " << sentences.size() + 1 << ": not a list of token ids: " << line << "\n";
      return 1;
    }
    if (!ids.empty())
      sentences.push_back(ids);
  }
  try {
    example_model::Model model(argv[1]);              // throws example_model::Error
    example_model::Scores s = model.score(sentences); // one batch
    for (size_t b = 0; b < sentences.size(); ++b) {
      std::printf("{\"token_logprobs\":[");
      for (size_t i = 0; i < s.token_logprobs[b].size(); ++i)
        std::printf("%s%.7g", i ? "," : "", s.token_logprobs[b][i]);
      std::printf("],\"score\":%.7g}\n", s.scores[b]);
    }
  } catch (const example_model::Error &e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
