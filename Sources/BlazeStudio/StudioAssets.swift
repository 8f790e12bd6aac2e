/// The app's files, built into the binary from `Sources/BlazeStudio/Assets` (SwiftPM's `embedInCode` resources): no
/// bundler, no files to install beside the binary.
enum StudioAssets {
    /// The page.
    static let indexHTML = PackageResources.index_html
    /// The app (modern browser JavaScript, no dependencies).
    static let script = PackageResources.studio_js
    /// Its style sheet.
    static let styles = PackageResources.studio_css
}
