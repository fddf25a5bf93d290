// What including kiln.hpp costs: an empty main.
#include <kiln/kiln.hpp>

int main() {}
