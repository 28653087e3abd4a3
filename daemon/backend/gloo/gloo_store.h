/*
 * Gloo's rendezvous::Store on top of the C callbacks of gs_gloo_store_ops,
 * so that the daemon can carry Gloo's addresses through its own rendezvous.
 * Every wait is cut at one deadline for the whole of gs_gloo_create: Gloo
 * waits for each peer's key with its full timeout in turn, which would
 * otherwise add up to (size - 1) timeouts.
 */
#pragma once

#include <chrono>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "backend/gloo/gloo_comm.h"

namespace gs {

// A store failure: code is the GS_E* code the caller's callback returned.
struct StoreError : std::runtime_error {
	StoreError(int c, const std::string &msg) : std::runtime_error(msg), code(c)
	{
	}
	int code;
};

class CallbackStore : public gloo::rendezvous::Store {
      public:
	CallbackStore(const gs_gloo_store_ops &ops, std::chrono::steady_clock::time_point deadline);

	void set(const std::string &key, const std::vector<char> &data) override;
	std::vector<char> get(const std::string &key) override;
	void wait(const std::vector<std::string> &keys) override;
	void wait(const std::vector<std::string> &keys,
		  const std::chrono::milliseconds &timeout) override;

      private:
	const std::vector<char> &fetch(const std::string &key, std::chrono::milliseconds timeout);

	gs_gloo_store_ops ops_;
	std::chrono::steady_clock::time_point deadline_;
	// Values already read: Gloo waits for a key, then gets it.
	std::map<std::string, std::vector<char>> cache_;
};

} // namespace gs
