// Package images owns image builds on the controlplane: it turns a recipe
// (sandbox/image/recipe) into a build task on the build pool (default when
// there is none), decides what is cached (a workspace's READY image of the
// same recipe hash, the deepest step image of the same step keys), joins a
// second caller to a build in flight, records the result once the task has
// ended (the registry is the record of what the build pushed), and keeps
// copy steps' blobs in the image registry (levers9/blobs).
//
// It must never: build for one workspace with another's blobs or step
// images, hand push credentials to anything but the build's attempt (that
// is dispatch's, see tasks.attachBuild), or keep a blob whose bytes do not
// hash to its digest.
package images
