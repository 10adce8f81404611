//===- Plot.cpp - RUN_DIR/loss.png from RUN_DIR/log.jsonl (PLplot) -------------===//
#include "tools/lmcc/TrainRun.h"

#include <nlohmann/json.hpp>
#include <plplot.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace lmcc::cli {

void plotRun(const std::string &runDir) {
  namespace fs = std::filesystem;
  const fs::path log = fs::path(runDir) / "log.jsonl";
  std::ifstream in(log);
  if (!in)
    throw RunError(log.string() + ": cannot open (lmcc plot needs a run directory of lmcc train --data)");
  std::vector<PLFLT> step, loss, validStep, validLoss;
  std::string line;
  for (int64_t no = 1; std::getline(in, line); ++no) {
    if (line.empty())
      continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception &e) {
      throw RunError(log.string() + ":" + std::to_string(no) + ": invalid JSON: " + e.what());
    }
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number())
      throw RunError(log.string() + ":" + std::to_string(no) + ": no \"step\"");
    const double s = j["step"].get<double>();
    if (j.contains("loss") && j["loss"].is_number())
      step.push_back(s), loss.push_back(j["loss"].get<double>());
    if (j.contains("valid_loss") && j["valid_loss"].is_number())
      validStep.push_back(s), validLoss.push_back(j["valid_loss"].get<double>());
  }
  if (step.empty() && validStep.empty())
    throw RunError(log.string() + ": no loss to plot yet");

  double xmax = 1, ymin = INFINITY, ymax = -INFINITY;
  for (const auto *v : {&step, &validStep})
    for (double x : *v)
      xmax = std::max(xmax, x);
  for (const auto *v : {&loss, &validLoss})
    for (double y : *v)
      ymin = std::min(ymin, y), ymax = std::max(ymax, y);
  const double pad = std::max(1e-3, 0.05 * (ymax - ymin));

  // Drawn into a temporary file in the run directory, then renamed over loss.png.
  const fs::path png = fs::path(runDir) / "loss.png";
  requireReplaceable(png.string());
  const std::string tmp = png.string() + ".tmp-" + std::to_string(::getpid());
  PLINT stream = 0;
  plmkstrm(&stream); // a fresh PLplot stream: nothing is left over from an earlier plot
  if (stream < 0)
    throw RunError("PLplot: no free stream");
  plsdev("pngcairo");
  plsfnam(tmp.c_str());
  plspage(0, 0, 900, 560, 0, 0);
  plscolbg(255, 255, 255);
  plscol0(1, 0, 0, 0);        // axes and labels: black
  plscol0(2, 31, 119, 180);   // training loss
  plscol0(3, 214, 39, 40);    // validation loss
  plinit();
  plcol0(1);
  plenv(0, xmax, ymin - pad, ymax + pad, 0, 0);
  pllab("step", "loss (nats per target)", ("lmcc train: " + fs::path(runDir).filename().string()).c_str());
  plwidth(2);
  if (!step.empty()) {
    plcol0(2);
    plline(PLINT(step.size()), step.data(), loss.data());
  }
  if (!validStep.empty()) {
    plcol0(3);
    plline(PLINT(validStep.size()), validStep.data(), validLoss.data());
    plstring(PLINT(validStep.size()), validStep.data(), validLoss.data(), "#(728)");
  }
  PLINT opts[] = {PL_LEGEND_LINE, PL_LEGEND_LINE | PL_LEGEND_SYMBOL};
  const char *texts[] = {"training (mean since the last log point)", "validation"};
  PLINT textColors[] = {1, 1}, lineColors[] = {2, 3}, lineStyles[] = {1, 1}, symbolColors[] = {2, 3};
  PLINT symbolNumbers[] = {0, 1}, boxColors[] = {0, 0}, boxPatterns[] = {0, 0};
  PLFLT lineWidths[] = {2, 2}, symbolScales[] = {1, 1}, boxScales[] = {0, 0}, boxWidths[] = {0, 0};
  const char *symbols[] = {"", "#(728)"};
  PLFLT width = 0, height = 0;
  plcol0(1);
  pllegend(&width, &height, PL_LEGEND_BACKGROUND | PL_LEGEND_BOUNDING_BOX, PL_POSITION_TOP | PL_POSITION_RIGHT |
           PL_POSITION_INSIDE, 0.02, 0.02, 0.08, 0, 1, 1, 0, 0, 2, opts, 1.0, 0.9, 2.0, 0.0, textColors, texts,
           boxColors, boxPatterns, boxScales, boxWidths, lineColors, lineStyles, lineWidths, symbolColors,
           symbolScales, symbolNumbers, symbols);
  plend1();
  std::error_code ec;
  if (!fs::exists(tmp) || fs::file_size(tmp, ec) == 0) {
    fs::remove(tmp, ec);
    throw RunError(png.string() + ": PLplot wrote nothing (is plplot-driver-cairo installed?)");
  }
  fs::rename(tmp, png, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw RunError(png.string() + ": cannot rename into place: " + ec.message());
  }
}

} // namespace lmcc::cli
