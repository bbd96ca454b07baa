// Everything the process logs through spdlog's default logger while a CapturedLog lives, for
// tests that check what a log line says (escaped, bounded, naming its input).
//
// spdlog's logger does not guard its list of sinks: adding or removing one while another
// thread logs is a data race (a worker's threads may still be logging when a test's
// CapturedLog goes). So the default logger gets one distributing sink, once, and is never
// changed again; each CapturedLog adds its own sink to that one and removes it, under the
// distributing sink's lock, which every log call takes too.
#pragma once

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/dist_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>

namespace tessera::testing {

class CapturedLog {
 public:
  CapturedLog() : sink_(std::make_shared<TextSink>()) { Captures()->add_sink(sink_); }
  ~CapturedLog() { Captures()->remove_sink(sink_); }
  CapturedLog(const CapturedLog&) = delete;
  CapturedLog& operator=(const CapturedLog&) = delete;

  std::string text() { return sink_->text(); }

 private:
  // The lines logged, read under the same lock their writes take.
  class TextSink final : public spdlog::sinks::base_sink<std::mutex> {
   public:
    std::string text() {
      std::lock_guard<std::mutex> lock(mutex_);
      return text_;
    }

   protected:
    void sink_it_(const spdlog::details::log_msg& msg) override {
      spdlog::memory_buf_t formatted;
      formatter_->format(msg, formatted);
      text_.append(formatted.data(), formatted.size());
    }
    void flush_() override {}

   private:
    std::string text_;
  };

  // The distributing sink, on the default logger from the first CapturedLog on (again, if a
  // test has set another default logger since).
  static std::shared_ptr<spdlog::sinks::dist_sink_mt> Captures() {
    static std::mutex mu;
    static std::shared_ptr<spdlog::sinks::dist_sink_mt> captures = std::make_shared<spdlog::sinks::dist_sink_mt>();
    std::lock_guard<std::mutex> lock(mu);
    auto& sinks = spdlog::default_logger()->sinks();
    if (std::find(sinks.begin(), sinks.end(), captures) == sinks.end()) sinks.push_back(captures);
    return captures;
  }

  std::shared_ptr<TextSink> sink_;
};

}  // namespace tessera::testing
