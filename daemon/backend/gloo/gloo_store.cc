#include "backend/gloo/gloo_store.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "errors.h"

namespace gs {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

CallbackStore::CallbackStore(const gs_gloo_store_ops &ops, steady_clock::time_point deadline)
	: ops_(ops), deadline_(deadline)
{
}

void CallbackStore::set(const std::string &key, const std::vector<char> &data)
{
	int rc = ops_.set(ops_.ctx, key.c_str(), data.data(), data.size());
	if (rc < 0)
		throw StoreError(rc, "store: setting key \"" + key + "\": " + gs_error_name(rc));
}

std::vector<char> CallbackStore::get(const std::string &key)
{
	return fetch(key, kDefaultTimeout);
}

void CallbackStore::wait(const std::vector<std::string> &keys)
{
	wait(keys, kDefaultTimeout);
}

void CallbackStore::wait(const std::vector<std::string> &keys, const milliseconds &timeout)
{
	for (const auto &key : keys)
		fetch(key, timeout);
}

static bool is_number(const std::string &s)
{
	return !s.empty() &&
	       std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

// Gloo's keys are "rank_<r>" (rank r's host name, which lower ranks read to
// tell local peers) and "<r>" (its addresses); name the rank in errors.
static std::string describe(const std::string &key)
{
	std::string quoted = " (store key \"" + key + "\")";
	if (is_number(key))
		return "rank " + key + " did not publish its addresses" + quoted;
	if (key.rfind("rank_", 0) == 0 && is_number(key.substr(5)))
		return "rank " + key.substr(5) + " did not publish its host name" + quoted;
	return "store key \"" + key + "\" did not appear";
}

const std::vector<char> &CallbackStore::fetch(const std::string &key, milliseconds timeout)
{
	auto hit = cache_.find(key);
	if (hit != cache_.end())
		return hit->second;

	auto left = std::chrono::duration_cast<milliseconds>(deadline_ - steady_clock::now());
	long ms = std::max<long>(0, std::min<long>(timeout.count(), left.count()));
	void *value = nullptr;
	size_t len = 0;
	int rc = ops_.get(ops_.ctx, key.c_str(), &value, &len, (int)ms);
	if (rc == GS_ETIMEDOUT)
		throw StoreError(rc, describe(key) + " within " + std::to_string(ms) + " ms");
	if (rc < 0)
		throw StoreError(rc, "store: getting key \"" + key + "\": " + gs_error_name(rc));

	const char *bytes = static_cast<const char *>(value);
	std::vector<char> copy(bytes, bytes + len);
	std::free(value);
	return cache_.emplace(key, std::move(copy)).first->second;
}

} // namespace gs
