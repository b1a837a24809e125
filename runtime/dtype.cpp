#include "runtime/dtype.h"

#include <stdexcept>

namespace meshfuse {

size_t dataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::Float: return 4;
    case DataType::Double: return 8;
    case DataType::Half: return 2;
    case DataType::BFloat16: return 2;
    case DataType::Int: return 8;
    case DataType::Int32: return 4;
    case DataType::Bool: return 1;
  }
  throw std::invalid_argument("unknown DataType");
}

std::string toString(DataType dtype) {
  switch (dtype) {
    case DataType::Float: return "Float";
    case DataType::Double: return "Double";
    case DataType::Half: return "Half";
    case DataType::BFloat16: return "BFloat16";
    case DataType::Int: return "Int";
    case DataType::Int32: return "Int32";
    case DataType::Bool: return "Bool";
  }
  return "?";
}

bool isFloatingPoint(DataType dtype) {
  return dtype == DataType::Float || dtype == DataType::Double || dtype == DataType::Half ||
         dtype == DataType::BFloat16;
}

bool isIntegral(DataType dtype) { return dtype == DataType::Int || dtype == DataType::Int32; }

namespace {
// Rank in the promotion lattice: bool < int32 < int64 < half/bf16 < float < double.
int promotionRank(DataType d) {
  switch (d) {
    case DataType::Bool: return 0;
    case DataType::Int32: return 1;
    case DataType::Int: return 2;
    case DataType::Half: return 3;
    case DataType::BFloat16: return 3;
    case DataType::Float: return 4;
    case DataType::Double: return 5;
  }
  return 0;
}
}  // namespace

DataType promoteTypes(DataType a, DataType b) {
  if (a == b) return a;
  // Half and BFloat16 together have no common 16-bit type: use Float, as torch does.
  if ((a == DataType::Half && b == DataType::BFloat16) || (a == DataType::BFloat16 && b == DataType::Half))
    return DataType::Float;
  return promotionRank(a) >= promotionRank(b) ? a : b;
}

}  // namespace meshfuse
