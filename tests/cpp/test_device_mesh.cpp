// DeviceMesh's teams: the devices a communication along one mesh dim, or along several at once (the
// one allreduce that resolves a value Partial along two dims), runs between.
#include <gtest/gtest.h>

#include "ir/user_error.h"
#include "multidevice/device_mesh.h"

namespace meshfuse {
namespace {

using Ids = std::vector<int64_t>;

TEST(DeviceMesh, TeamAlongOneDimVariesOnlyThatCoordinate) {
  // [2, 3]: mesh_y rows {10 11 12} and {13 14 15}, mesh_x along each row.
  const DeviceMesh mesh({10, 11, 12, 13, 14, 15}, {2, 3});
  EXPECT_EQ(mesh.team(14, ParallelType::MeshX), (Ids{13, 14, 15}));
  EXPECT_EQ(mesh.team(14, ParallelType::MeshY), (Ids{11, 14}));
  EXPECT_EQ(mesh.team(14, ParallelType::MeshZ), (Ids{14}));  // no such dim: alone
  EXPECT_EQ(mesh.coordinate(14, ParallelType::MeshX), 1);
  EXPECT_EQ(mesh.coordinate(14, ParallelType::MeshY), 1);
}

TEST(DeviceMesh, TeamAlongSeveralDimsKeepsTheOtherCoordinates) {
  // [2, 2, 2]: index = 4 z + 2 y + x.
  const DeviceMesh mesh({0, 1, 2, 3, 4, 5, 6, 7}, {2, 2, 2});
  EXPECT_EQ(mesh.team(5, {ParallelType::MeshX, ParallelType::MeshY}), (Ids{4, 5, 6, 7}));
  EXPECT_EQ(mesh.team(5, {ParallelType::MeshX, ParallelType::MeshZ}), (Ids{0, 1, 4, 5}));
  EXPECT_EQ(mesh.team(5, {ParallelType::MeshY, ParallelType::MeshZ}), (Ids{1, 3, 5, 7}));
  EXPECT_EQ(mesh.team(5, {ParallelType::MeshX, ParallelType::MeshY, ParallelType::MeshZ}), mesh.devices());
  EXPECT_EQ(mesh.team(5, std::vector<ParallelType>{ParallelType::MeshX}), mesh.team(5, ParallelType::MeshX));
  EXPECT_EQ(mesh.team(5, std::vector<ParallelType>{}), (Ids{5}));
  EXPECT_THROW(mesh.team(9, {ParallelType::MeshX, ParallelType::MeshY}), UserError);
}

}  // namespace
}  // namespace meshfuse
