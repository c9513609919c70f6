"""Running commands safely: process trees, deadlines, output caps, the tree's lock, protection and the clean room."""
