#include "backends/ucc/ucc_team.h"

#include <cstring>
#include <string>

#include "backends/backend.h"
#include "backends/poll_until.h"
#include "backends/ucc/ucc_context.h"
#include "backends/ucc/ucc_oob.h"
#include "multidevice/communicator.h"

namespace meshfuse::ucc {

Team::Team(Communicator& communicator, const std::vector<int64_t>& team, int64_t rank_in_team,
           std::chrono::milliseconds timeout)
    : communicator_(communicator), oob_(new Oob{&communicator, team, std::chrono::steady_clock::now() + timeout, {}}) {
  Context& context = Context::forTeam(communicator, team, timeout);
  ucc_team_params_t params;
  std::memset(&params, 0, sizeof params);
  params.mask = UCC_TEAM_PARAM_FIELD_OOB | UCC_TEAM_PARAM_FIELD_EP | UCC_TEAM_PARAM_FIELD_EP_RANGE;
  params.oob = oob_->coll(rank_in_team);
  params.ep = static_cast<uint64_t>(rank_in_team);
  params.ep_range = UCC_COLLECTIVE_EP_RANGE_CONTIG;
  ucc_context_h context_handle = context.handle();
  ucc_status_t status = ucc_team_create_post(&context_handle, 1, &params, &team_);
  if (status == UCC_OK) {
    pollUntil(
        [&] {
          context.progress();
          status = ucc_team_create_test(team_);
          return status != UCC_INPROGRESS;
        },
        oob_->deadline);
  }
  const std::string where =
      "ucc team creation on team " + teamToString(team) + " at team rank " + std::to_string(rank_in_team);
  if (status != UCC_OK) team_ = nullptr;  // half-created or failed: left alone
  oob_->rethrow();                        // a timeout of the exchange, most likely
  if (status == UCC_INPROGRESS)
    throw CommunicationTimeout(where + ": waited " + std::to_string(timeout.count()) + " ms for the other members");
  check(status, where.c_str());
}

Team::~Team() {
  if (!team_ || communicator_.broken()) return;
  Context& context = Context::instance();
  pollUntil(
      [&] {
        if (ucc_team_destroy(team_) != UCC_INPROGRESS) return true;
        context.progress();
        return false;
      },
      std::chrono::steady_clock::now() + std::chrono::seconds(5));
}

}  // namespace meshfuse::ucc
