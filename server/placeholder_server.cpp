// placeholder so the library has a source until the layer lands
namespace mx {}
