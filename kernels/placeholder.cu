// placeholder until the first kernel family lands
namespace mx {}
